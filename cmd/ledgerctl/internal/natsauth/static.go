package natsauth

import (
	"fmt"
	"strings"

	"github.com/nats-io/nkeys"
)

// StaticConfFile is the name of the server configuration Static writes.
const StaticConfFile = "auth.conf"

// Static writes the static configuration of an authenticated deployment
// into s.Dir: one nkey seed per user (<user>.nk, 0600; an existing one is
// kept) and StaticConfFile, the accounts, users and permissions for the
// server to include. Nobody shares a secret: each service, worker
// principal and reader has its own key.
func Static(s Setup) ([]User, error) {
	s, err := s.normalize()
	if err != nil {
		return nil, err
	}
	us := s.users()
	keys := make([]string, len(us))
	for i := range us {
		us[i].File = s.path(userFile(us[i].Role, us[i].Name) + ".nk")
		kp, created, err := seedFile(us[i].File, nkeys.PrefixByteUser)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", us[i].Role, us[i].Name, err)
		}
		us[i].New = created
		if keys[i], err = kp.PublicKey(); err != nil {
			return nil, fmt.Errorf("public key of %s: %w", us[i].File, err)
		}
	}
	conf, err := renderStatic(s, us, keys)
	if err != nil {
		return nil, err
	}
	if err := writeFile(s.path(StaticConfFile), conf, publicMode); err != nil {
		return nil, err
	}
	return us, nil
}

// confWriter writes the NATS server configuration syntax. Every string it
// quotes comes from validated names and fixed subjects, so none holds a
// quote, a backslash or a line end.
type confWriter struct {
	b      strings.Builder
	indent int
}

func (w *confWriter) line(format string, args ...any) {
	if format != "" {
		w.b.WriteString(strings.Repeat("  ", w.indent))
		fmt.Fprintf(&w.b, format, args...)
	}
	w.b.WriteByte('\n')
}

func (w *confWriter) open(format string, args ...any) {
	w.line(format, args...)
	w.indent++
}

func (w *confWriter) close(s string) {
	w.indent--
	w.line("%s", s)
}

func quoted(s string) string { return `"` + s + `"` }

func quotedList(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = quoted(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

func (w *confWriter) list(key string, ss []string) {
	w.open("%s: [", key)
	for _, s := range ss {
		w.line("%s", quoted(s))
	}
	w.close("]")
}

// commandLine is the command that writes the files of s, for their header.
func commandLine(sub string, s Setup) string {
	parts := []string{"ledgerctl auth", sub}
	if s.Layout.prefix != "ledger" {
		parts = append(parts, "-prefix", s.Layout.prefix)
	}
	for _, w := range s.Workers {
		parts = append(parts, "-worker", w)
	}
	for _, r := range s.Readers {
		parts = append(parts, "-reader", r)
	}
	return strings.Join(parts, " ") + " -out DIR"
}

func renderStatic(s Setup, us []User, keys []string) ([]byte, error) {
	var w confWriter
	w.line("# NATS authorization of the ledger (contract §9), written by")
	w.line("#   %s", commandLine("static", s))
	w.line("# Include it from the server's configuration: include \"%s\".", StaticConfFile)
	w.line("# It holds public keys only. Each user's seed is in <user>.nk beside it;")
	w.line("# running the command again with the same directory keeps them.")
	w.line("# docs/security.md says which attack each permission refuses.")
	w.line("")
	w.open("accounts {")

	readers := readerAccounts(s.Readers)
	accounts := append([]string{AccountLedger, AccountWorkers}, readers...)
	for _, acc := range accounts {
		switch {
		case acc == AccountLedger:
			w.line("# The services and ledgerctl, with every stream and bucket.")
		case acc == AccountWorkers:
			w.line("# One user per worker principal. The account reaches the ledger only")
			w.line("# through LEDGER's exports, so every reply a worker asks for (publish")
			w.line("# acks, lease replies) comes back into this account.")
		default:
			w.line("# A reader: get a projection, follow the bucket's changes. Nothing else")
			w.line("# reaches this account, and nothing of it reaches another.")
		}
		w.open("%s: {", quoted(acc))
		if acc == AccountLedger {
			w.open("jetstream: {")
			w.line("max_mem: %d", s.Limits.MaxMem)
			w.line("max_file: %d", s.Limits.MaxFile)
			w.line("max_streams: %d", s.Limits.MaxStreams)
			w.line("max_consumers: %d", s.Limits.MaxConsumers)
			w.close("}")
		}
		w.open("users: [")
		for i, u := range us {
			if u.Account != acc {
				continue
			}
			p, err := s.Layout.Permissions(u.Role, u.Name)
			if err != nil {
				return nil, err
			}
			who := u.Role
			if u.Name != u.Role {
				who += " " + u.Name
			}
			w.line("# %s: seed %s.nk, inbox prefix %s", who, userFile(u.Role, u.Name), u.Inbox)
			w.open("{")
			w.line("nkey: %s", keys[i])
			w.open("permissions: {")
			w.open("publish: {")
			w.list("allow", p.Publish)
			w.close("}")
			w.open("subscribe: {")
			w.list("allow", p.Subscribe)
			w.close("}")
			if p.Responses {
				w.line("allow_responses: true")
			}
			w.close("}")
			w.close("}")
		}
		w.close("]")
		switch {
		case acc == AccountLedger:
			w.open("exports: [")
			for _, e := range s.Layout.WorkerExports() {
				w.line("{ %s: %s, accounts: %s }", exportKind(e), quoted(e.Subject), quotedList([]string{AccountWorkers}))
			}
			if len(readers) > 0 {
				for _, e := range s.Layout.ReaderExports() {
					w.line("{ %s: %s, accounts: %s }", exportKind(e), quoted(e.Subject), quotedList(readers))
				}
			}
			w.close("]")
		case acc == AccountWorkers:
			imports(&w, s.Layout.WorkerExports())
		default:
			imports(&w, s.Layout.ReaderExports())
		}
		w.close("}")
	}
	w.close("}")
	return []byte(w.b.String()), nil
}

func exportKind(e Export) string {
	if e.Service {
		return "service"
	}
	return "stream"
}

func imports(w *confWriter, exports []Export) {
	w.open("imports: [")
	for _, e := range exports {
		share := ""
		if e.Share {
			share = ", share: true"
		}
		w.line("{ %s: { account: %s, subject: %s }%s }", exportKind(e), quoted(AccountLedger), quoted(e.Subject), share)
	}
	w.close("]")
}
