package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
)

// A replay is a POST that must come from a page of the console itself. The
// page's form carries a token: the HMAC, under a secret drawn when the
// process starts, of a random nonce that the browser holds in a SameSite
// cookie. A cross-site page can make the browser send a POST, but cannot
// read the token out of the console's page, and a token is good only with
// its own cookie and only until the console restarts.

// csrfCookie names the cookie that holds the nonce.
const csrfCookie = "ledger_console_csrf"

// csrfField names the form field that carries the token.
const csrfField = "csrf"

type csrf struct{ key []byte }

func newCSRF() (*csrf, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	return &csrf{key: key}, nil
}

func (c *csrf) mac(nonce string) string {
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte(nonce))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// validNonce reports whether s is a nonce as issue draws them: 32 random
// bytes, base64url.
func validNonce(s string) bool {
	b, err := base64.RawURLEncoding.DecodeString(s)
	return err == nil && len(b) == 32
}

// issue returns the token for a page's form, and sets the nonce cookie
// when the browser has none yet.
func (c *csrf) issue(w http.ResponseWriter, r *http.Request) string {
	if ck, err := r.Cookie(csrfCookie); err == nil && validNonce(ck.Value) {
		return c.mac(ck.Value)
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand never fails on supported platforms
	nonce := base64.RawURLEncoding.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: nonce, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	return c.mac(nonce)
}

var (
	errNoCookie  = errors.New("the console's cookie is missing: open the dead letter's page again and replay from there")
	errBadToken  = errors.New("the form's token does not match: open the dead letter's page again (a restarted console issues new tokens)")
	errCrossSite = errors.New("the request did not come from a page of this console")
)

// check verifies a POST's token against its cookie.
func (c *csrf) check(r *http.Request) error {
	ck, err := r.Cookie(csrfCookie)
	if err != nil || !validNonce(ck.Value) {
		return errNoCookie
	}
	if !hmac.Equal([]byte(c.mac(ck.Value)), []byte(r.PostFormValue(csrfField))) {
		return errBadToken
	}
	return nil
}

// sameOrigin checks that a request came from a page of the console: a
// browser says where a request comes from in Sec-Fetch-Site and Origin (it
// sends Origin with every POST), and a script cannot forge either.
func sameOrigin(r *http.Request) error {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
		return errCrossSite
	}
	scheme := "http://"
	if r.TLS != nil {
		scheme = "https://"
	}
	if r.Header.Get("Origin") != scheme+r.Host {
		return errCrossSite
	}
	return nil
}
