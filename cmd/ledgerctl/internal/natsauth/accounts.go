package natsauth

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/jwt/v2"

	"github.com/flowness/ledger/internal/projector"
	"github.com/flowness/ledger/pkg/wire"
)

// File storage of the accounts that hold no log: room for their streams'
// and buckets' own bounds (LEDGER_IN 2 GiB, LEDGER_DLQ 1 GiB; ledger_tasks
// and its rebuild 512 MiB each), with some to spare. The principals'
// inboxes, when on, add their max_bytes each (Setup.InboxMaxBytes).
const (
	inboundFile     = 8 << 30
	projectionsFile = 4 << 30
)

// Account is one account of a deployment: its JetStream limits (nil: no
// JetStream), the roles whose users it holds, and what it exports and
// imports.
type Account struct {
	Name      string
	JetStream *Limits
	Roles     []string
	// UserName is the worker principal or reader whose account it is; ""
	// for the services' accounts.
	UserName string
	Exports  []Export
	Imports  []Import
}

// Export is a subject an account offers to others.
type Export struct {
	Subject string
	// Service: requests come in and the answer goes back to the
	// requester's account. Otherwise a stream: the account's messages on
	// the subject are delivered to the importers too.
	Service bool
	// StreamResponses lets a service answer a request more than once (a
	// pull request's messages, a ping answered by every ingest).
	StreamResponses bool
	// To are the accounts that may import it.
	To []string
}

// Import is a subject an account takes from another's export, under the
// same name.
type Import struct {
	Subject, From string
	Service       bool
	// Share: the importer tells the exporter who sent each request (the
	// server's Nats-Request-Info header names the user), so the lease
	// service charges a public read to its sender's share.
	Share bool
}

// owners maps each stream and bucket stream to the account that holds it.
// The principals' inboxes are beside LEDGER_IN, whose subjects they hold.
func (l Layout) owners() map[string]string {
	o := map[string]string{
		wire.StreamIn:                   AccountLedger,
		wire.StreamDLQ:                  AccountLedger,
		"KV_" + wire.BucketWitness:      AccountLedger,
		"KV_" + wire.BucketLeases:       AccountLedger,
		wire.StreamLog:                  AccountLog,
		"KV_" + l.tasksBucket:           AccountProjections,
		"KV_" + l.marksBucket:           AccountProjections,
		"KV_" + projector.RebuildBucket: AccountProjections,
	}
	for _, n := range l.inboxes {
		o[n] = AccountLedger
	}
	return o
}

// ownerOf is the account that answers a request on subject, or "" when
// it is the requester's own.
func (l Layout) ownerOf(subject string) string {
	owners := l.owners()
	tokens := strings.Split(subject, ".")
	switch {
	case subject == "$JS.API.INFO" || strings.HasPrefix(subject, "$JS.API.STREAM.NAMES") || strings.HasPrefix(subject, "$JS.API.STREAM.LIST"):
		return AccountLedger
	case strings.HasPrefix(subject, "$JS."):
		for _, tok := range tokens[2:] {
			if a, ok := owners[tok]; ok {
				return a
			}
		}
	case strings.HasPrefix(subject, "$KV.") && len(tokens) > 1:
		return owners["KV_"+tokens[1]]
	case strings.HasPrefix(subject, "$SRV."):
		return AccountIngest
	case strings.HasPrefix(subject, l.p("in.")), strings.HasPrefix(subject, l.p("dlq.")):
		return AccountLedger
	case strings.HasPrefix(subject, l.p("log.")):
		return AccountLog
	case strings.HasPrefix(subject, l.p("lease.")), subject == l.p("task.head"), strings.HasPrefix(subject, l.p("receipt.")):
		return AccountIngest
	}
	return ""
}

// operatorImports are what the operators' account takes: every stream's
// API, every subject of the ledger and the lease service. Operators may do
// everything; their account keeps them out of the streams' accounts too,
// so that no user at all is in one.
func (l Layout) operatorImports() []Import {
	var im []Import
	svc := func(subject string) {
		im = append(im, Import{Subject: subject, From: l.ownerOf(subject), Service: true})
	}
	svc("$JS.API.INFO")
	svc("$JS.API.STREAM.NAMES")
	svc("$JS.API.STREAM.LIST")
	owners := l.owners()
	names := make([]string, 0, len(owners))
	for n := range owners {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		for _, s := range []string{"$JS.API.STREAM.*." + n, "$JS.API.STREAM.MSG.*." + n, "$JS.API.DIRECT.GET." + n,
			"$JS.API.DIRECT.GET." + n + ".>", "$JS.API.CONSUMER.*." + n, "$JS.API.CONSUMER.*." + n + ".>",
			"$JS.API.CONSUMER.MSG.NEXT." + n + ".*", "$JS.API.CONSUMER.DURABLE.CREATE." + n + ".*",
			"$JS.ACK." + n + ".>", "$JS.FC." + n + ".>"} {
			svc(s)
		}
		if b, ok := strings.CutPrefix(n, "KV_"); ok {
			svc("$KV." + b + ".>")
		}
	}
	for _, s := range []string{l.p("in.>"), l.p("dlq.>"), l.p("log.>"), l.p("lease.>"), l.p("task.head"), "$SRV.>"} {
		svc(s)
	}
	im = append(im, Import{Subject: l.p("receipt.>"), From: AccountIngest})
	inbox := InboxPrefix(RoleLedgerctl, "") + ".>"
	for _, a := range []string{AccountLedger, AccountLog, AccountProjections} {
		im = append(im, Import{Subject: inbox, From: a}, Import{Subject: "$JS.EVENT.>", From: a})
	}
	return im
}

// importsOf are the imports of the account of role; name is a worker
// principal's or a reader's.
func (l Layout) importsOf(role, name string) ([]Import, error) {
	switch role {
	case RoleLedgerctl:
		return l.operatorImports(), nil
	case RoleReader:
		return []Import{
			{Subject: "$JS.API.DIRECT.GET.KV_" + l.tasksBucket + ".>", From: AccountProjections, Service: true},
			// The bucket's writers' writes, as they send them: a message a
			// service import brought into the buckets' account goes to no
			// stream export from there. Operators write it too: `ledgerctl
			// repair` and `rebuild`.
			{Subject: "$KV." + l.tasksBucket + ".>", From: AccountProjector},
			{Subject: "$KV." + l.tasksBucket + ".>", From: AccountOperators},
		}, nil
	}
	// A service: what its permissions let it publish, from the account
	// that answers it.
	p, err := l.Permissions(role, name)
	if err != nil {
		return nil, err
	}
	own := accountOf(role, name)
	var im []Import
	for _, s := range p.Publish {
		from := l.ownerOf(s)
		if from == "" || from == own {
			continue
		}
		im = append(im, Import{Subject: s, From: from, Service: true})
	}
	switch role {
	case RoleProjector:
		// Its bucket watches and key lists deliver to its inbox, in the
		// buckets' account.
		im = append(im, Import{Subject: InboxPrefix(role, "") + ".>", From: AccountProjections})
	case RoleWorker:
		// The lease service charges a public read to the user the server
		// names in the request (Share); a principal's receipts, and no
		// other's, come into its account.
		for i := range im {
			im[i].Share = im[i].From == AccountIngest
		}
		im = append(im, Import{Subject: l.p("receipt." + name + ".>"), From: AccountIngest})
	}
	return im, nil
}

// exportsOf are the subjects account offers, before the importers are
// known; every import must lie within one of them.
func (l Layout) exportsOf(account string) []Export {
	js := []Export{
		{Subject: "$JS.API.>", Service: true, StreamResponses: true},
		{Subject: "$JS.ACK.>", Service: true},
		{Subject: "$JS.FC.>", Service: true},
		{Subject: "$KV.>", Service: true},
		{Subject: InboxPrefix(RoleLedgerctl, "") + ".>"},
		{Subject: "$JS.EVENT.>"},
	}
	switch account {
	case AccountLedger:
		return append(js, Export{Subject: l.p("in.>"), Service: true}, Export{Subject: l.p("dlq.>"), Service: true})
	case AccountLog:
		return append(js, Export{Subject: l.p("log.>"), Service: true})
	case AccountProjections:
		return append(js, Export{Subject: InboxPrefix(RoleProjector, "") + ".>"})
	case AccountProjector, AccountOperators:
		return []Export{{Subject: "$KV." + l.tasksBucket + ".>"}}
	case AccountIngest:
		return []Export{
			{Subject: l.p("lease.>"), Service: true},
			{Subject: l.p("task.head"), Service: true},
			{Subject: "$SRV.>", Service: true, StreamResponses: true},
			{Subject: l.p("receipt.>")},
		}
	}
	return nil
}

// accounts lays out every account of s: the three that hold the streams
// and no user, then one per role (one per worker principal and per
// reader), each with what it
// imports, and on the other side the exports those imports need.
func (s Setup) accounts() ([]*Account, error) {
	lim := s.Limits
	inbound, projections := lim, lim
	inbound.MaxFile, projections.MaxFile = inboundFile, projectionsFile
	// Each principal's inbox is one more stream of its max_bytes, beside
	// LEDGER_IN's room: an operator moves from one to the other.
	n := int64(len(s.Layout.inboxes))
	inbound.MaxFile += n * s.InboxMaxBytes
	inbound.MaxStreams += n
	accs := []*Account{
		{Name: AccountLedger, JetStream: &inbound},
		{Name: AccountLog, JetStream: &lim},
		{Name: AccountProjections, JetStream: &projections},
		{Name: AccountIngest, Roles: []string{RoleIngest}},
		{Name: AccountProjector, Roles: []string{RoleProjector}},
		{Name: AccountOperators, Roles: []string{RoleLedgerctl}},
	}
	for _, w := range s.Workers {
		accs = append(accs, &Account{Name: WorkerAccount(w), Roles: []string{RoleWorker}, UserName: w})
	}
	for _, r := range s.Readers {
		accs = append(accs, &Account{Name: ReaderAccount(r), Roles: []string{RoleReader}, UserName: r})
	}
	byName := map[string]*Account{}
	for _, a := range accs {
		byName[a.Name] = a
		a.Exports = s.Layout.exportsOf(a.Name)
	}
	for _, a := range accs {
		if len(a.Roles) == 0 {
			continue
		}
		im, err := s.Layout.importsOf(a.Roles[0], a.UserName)
		if err != nil {
			return nil, err
		}
		for _, i := range im {
			if slices.ContainsFunc(a.Imports, func(j Import) bool { return j.Subject == i.Subject && j.From == i.From }) {
				continue
			}
			from := byName[i.From]
			if from == nil {
				return nil, fmt.Errorf("natsauth: %s imports %s from no account %q", a.Name, i.Subject, i.From)
			}
			k := slices.IndexFunc(from.Exports, func(e Export) bool {
				return e.Service == i.Service && jwt.Subject(i.Subject).IsContainedIn(jwt.Subject(e.Subject))
			})
			if k < 0 {
				return nil, fmt.Errorf("natsauth: %s exports nothing that holds %s, which %s imports", i.From, i.Subject, a.Name)
			}
			if !slices.Contains(from.Exports[k].To, a.Name) {
				from.Exports[k].To = append(from.Exports[k].To, a.Name)
			}
			a.Imports = append(a.Imports, i)
		}
	}
	// An export nobody imports is left out.
	for _, a := range accs {
		a.Exports = slices.DeleteFunc(a.Exports, func(e Export) bool { return len(e.To) == 0 })
	}
	return accs, nil
}
