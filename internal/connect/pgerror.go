package connect

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// explained is an error with PostgreSQL's detail and hint in its text.
type explained struct {
	err  error
	text string
}

func (e *explained) Error() string { return e.text }
func (e *explained) Unwrap() error { return e.err }

// Explain returns err with the detail and hint of the PostgreSQL error it
// wraps added to its text (pgx's own text has neither), so that what the
// server says to do next reaches the operator; other errors are returned
// as they are.
func Explain(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || (pgErr.Detail == "" && pgErr.Hint == "") {
		return err
	}
	text := err.Error()
	if pgErr.Detail != "" && !strings.Contains(text, pgErr.Detail) {
		text += fmt.Sprintf("; detail: %s", pgErr.Detail)
	}
	if pgErr.Hint != "" && !strings.Contains(text, pgErr.Hint) {
		text += fmt.Sprintf("; hint: %s", pgErr.Hint)
	}
	return &explained{err: err, text: text}
}
