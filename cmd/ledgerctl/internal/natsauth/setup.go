package natsauth

import (
	"cmp"
	"errors"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/flowness/ledger/streams"
)

// Defaults of Limits: room for the ledger's five streams and buckets and
// their consumers, and for LEDGER_LOG to keep years of events.
const (
	// MaxMemDefault is the account's memory storage: 64 MiB.
	MaxMemDefault = 64 << 20
	// MaxFileDefault is the account's file storage: 100 GiB.
	MaxFileDefault = 100 << 30
	// MaxStreamsDefault is the account's stream count: 16.
	MaxStreamsDefault = 16
	// MaxConsumersDefault is the account's consumer count: 256. The ingest
	// has one consumer per partition (N, 16 by default), a projector one per
	// partition set; raise it for more than about 200 partitions.
	MaxConsumersDefault = 256
)

// Limits are the LEDGER account's JetStream limits: what its streams and
// buckets may take in all, so that a flood (dead letters, a runaway log)
// fills the account, not the server's disk.
type Limits struct {
	// MaxMem and MaxFile are bytes; defaults MaxMemDefault, MaxFileDefault.
	MaxMem, MaxFile int64
	// MaxStreams and MaxConsumers default to MaxStreamsDefault and
	// MaxConsumersDefault.
	MaxStreams, MaxConsumers int64
}

// WithDefaults returns l with zero fields set to their defaults.
func (l Limits) WithDefaults() Limits {
	l.MaxMem = cmp.Or(l.MaxMem, MaxMemDefault)
	l.MaxFile = cmp.Or(l.MaxFile, MaxFileDefault)
	l.MaxStreams = cmp.Or(l.MaxStreams, MaxStreamsDefault)
	l.MaxConsumers = cmp.Or(l.MaxConsumers, MaxConsumersDefault)
	return l
}

// Setup is what to generate: where, for which ledger, and for whom.
type Setup struct {
	// Dir receives every file; created 0700 if missing. Keys already in it
	// are reused.
	Dir string
	// Layout is the ledger's subject prefix and bucket names.
	Layout Layout
	// Workers are the worker principals: one user each.
	Workers []string
	// Readers are the read sides: one account and user each.
	Readers []string
	// Limits are the LEDGER account's JetStream limits.
	Limits Limits
	// Inboxes gives every worker principal the permissions and the room of
	// an inbox stream of its own, LEDGER_IN_<principal>, as `ledgerctl
	// streams apply -principals` creates them (docs/operations.md, "Inboxes
	// per principal"). Default false: LEDGER_IN only.
	Inboxes bool
	// InboxMaxBytes is the max_bytes each inbox is given by `streams apply
	// -inbox-max-bytes`; the LEDGER account's file storage grows by it per
	// principal. Only with Inboxes; default streams.InboxMaxBytesDefault.
	InboxMaxBytes int64
}

// MaxInboxMaxBytes is the largest InboxMaxBytes: 1 TiB.
const MaxInboxMaxBytes = 1 << 40

// normalize validates s and returns it with sorted, unique names and
// default limits, so that the same setup always gives the same files.
func (s Setup) normalize() (Setup, error) {
	if s.Dir == "" {
		return s, errors.New("no output directory")
	}
	if s.Layout.prefix == "" {
		return s, errors.New("natsauth: no layout (NewLayout)")
	}
	var err error
	if s.Workers, err = names("worker principal", s.Workers); err != nil {
		return s, err
	}
	if s.Readers, err = names("reader", s.Readers); err != nil {
		return s, err
	}
	s.Limits = s.Limits.WithDefaults()
	if s.Limits.MaxMem < 0 || s.Limits.MaxFile < 0 || s.Limits.MaxStreams < 0 || s.Limits.MaxConsumers < 0 {
		return s, errors.New("JetStream limits must not be negative")
	}
	switch {
	case s.InboxMaxBytes < 0 || s.InboxMaxBytes > MaxInboxMaxBytes:
		return s, fmt.Errorf("inbox max bytes %d: want 0..%d", s.InboxMaxBytes, int64(MaxInboxMaxBytes))
	case !s.Inboxes && s.InboxMaxBytes != 0:
		return s, errors.New("inbox max bytes without inboxes")
	case s.Inboxes:
		s.InboxMaxBytes = cmp.Or(s.InboxMaxBytes, streams.InboxMaxBytesDefault)
		s.Layout = s.Layout.WithInboxes(s.Workers)
	}
	return s, nil
}

func names(what string, in []string) ([]string, error) {
	out := slices.Clone(in)
	for _, n := range out {
		if !ValidName(n) {
			return nil, fmt.Errorf("%s %q: want 1..%d characters of [A-Za-z0-9_-]", what, n, MaxNameLen)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// User is one user the commands wrote a secret for.
type User struct {
	// Role is one of the Role constants.
	Role string
	// Name is the worker's principal, the reader's name, or for a service
	// its role.
	Name string
	// Account is the account the user belongs to.
	Account string
	// File is the user's seed (static) or credentials (operator mode) file.
	File string
	// Inbox is the inbox prefix the user must connect with.
	Inbox string
	// New is false when File existed and was kept.
	New bool
}

// userFile is the base name of a user's secret, without extension.
func userFile(role, name string) string {
	if role == RoleWorker || role == RoleReader {
		return role + "-" + name
	}
	return name
}

// WorkerAccount is the account of worker principal name.
func WorkerAccount(name string) string { return AccountWorkerPrefix + name }

// ReaderAccount is the account of reader name.
func ReaderAccount(name string) string { return AccountReaderPrefix + name }

// accountOf is the account of a user of role.
func accountOf(role, name string) string {
	switch role {
	case RoleWorker:
		return WorkerAccount(name)
	case RoleReader:
		return ReaderAccount(name)
	case RoleIngest:
		return AccountIngest
	case RoleProjector:
		return AccountProjector
	}
	return AccountOperators
}

// users lists the users of a setup, services first.
func (s Setup) users() []User {
	var us []User
	for _, r := range ServiceRoles {
		us = append(us, User{Role: r, Name: r})
	}
	for _, w := range s.Workers {
		us = append(us, User{Role: RoleWorker, Name: w})
	}
	for _, r := range s.Readers {
		us = append(us, User{Role: RoleReader, Name: r})
	}
	for i := range us {
		us[i].Account = accountOf(us[i].Role, us[i].Name)
		us[i].Inbox = InboxPrefix(us[i].Role, us[i].Name)
	}
	return us
}

// path is a file of the setup's directory.
func (s Setup) path(name string) string { return filepath.Join(s.Dir, name) }
