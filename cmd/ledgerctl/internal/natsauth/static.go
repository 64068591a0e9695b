package natsauth

import (
	"fmt"
	"strconv"
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
	if s.Inboxes {
		parts = append(parts, "-inboxes", "-inbox-max-bytes", strconv.FormatInt(s.InboxMaxBytes, 10))
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
	accounts, err := s.accounts()
	if err != nil {
		return nil, err
	}
	for _, acc := range accounts {
		w.line("# %s", accountNote(acc, s.Inboxes))
		w.open("%s: {", quoted(acc.Name))
		if l := acc.JetStream; l != nil {
			w.open("jetstream: {")
			w.line("max_mem: %d", l.MaxMem)
			w.line("max_file: %d", l.MaxFile)
			w.line("max_streams: %d", l.MaxStreams)
			w.line("max_consumers: %d", l.MaxConsumers)
			w.close("}")
		}
		if len(acc.Roles) > 0 {
			w.open("users: [")
			for i, u := range us {
				if u.Account != acc.Name {
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
		}
		if len(acc.Exports) > 0 {
			w.open("exports: [")
			for _, e := range acc.Exports {
				resp := ""
				if e.StreamResponses {
					resp = ", response_type: stream"
				}
				w.line("{ %s: %s, accounts: %s%s }", exportKind(e), quoted(e.Subject), quotedList(e.To), resp)
			}
			w.close("]")
		}
		if len(acc.Imports) > 0 {
			w.open("imports: [")
			for _, i := range acc.Imports {
				kind, share := "stream", ""
				if i.Service {
					kind = "service"
				}
				if i.Share {
					share = ", share: true"
				}
				w.line("{ %s: { account: %s, subject: %s }%s }", kind, quoted(i.From), quoted(i.Subject), share)
			}
			w.close("]")
		}
		w.close("}")
	}
	w.close("}")
	return []byte(w.b.String()), nil
}

// accountNote says in one line what an account is for.
func accountNote(a *Account, inboxes bool) string {
	switch a.Name {
	case AccountLedger:
		if inboxes {
			return "LEDGER_IN, each principal's LEDGER_IN_<principal>, LEDGER_DLQ and the ingest's buckets. No user: reached only through its exports."
		}
		return "LEDGER_IN, LEDGER_DLQ and the ingest's buckets. No user: reached only through its exports."
	case AccountLog:
		return "LEDGER_LOG. No user: reached only through its exports."
	case AccountProjections:
		return "The projector's buckets. No user: reached only through its exports."
	case AccountIngest:
		return "The ingest: serves the lease service, sends receipts."
	case AccountProjector:
		return "The projector."
	case AccountOperators:
		return "Operators (ledgerctl, the nats CLI): everything, through imports."
	}
	if len(a.Roles) > 0 && a.Roles[0] == RoleWorker {
		return "A worker principal: its events, leases and receipts; no other's replies land here."
	}
	return "A reader: get a projection, follow the bucket's changes."
}

func exportKind(e Export) string {
	if e.Service {
		return "service"
	}
	return "stream"
}
