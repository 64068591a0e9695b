package ctl

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowness/ledger/pkg/wire"
	"github.com/flowness/ledger/streams"
)

// stream opens one of the ledger's streams; a missing one is explained.
func stream(ctx context.Context, js jetstream.JetStream, name string) (jetstream.Stream, error) {
	ctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("stream %s does not exist: run 'ledgerctl streams apply' or start the ingest", name)
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	return s, nil
}

// inboxes are the streams that hold workers' events: LEDGER_IN, or each
// principal's own LEDGER_IN_<principal> (streams.Inboxes). The streams are
// listed only when LEDGER_IN is missing, so a credential that may not list
// them still gets LEDGER_IN at once.
func inboxes(ctx context.Context, js jetstream.JetStream, prefix string) []string {
	ctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	if _, err := js.Stream(ctx, wire.StreamIn); !errors.Is(err, jetstream.ErrStreamNotFound) {
		return []string{wire.StreamIn}
	}
	names, err := streams.Inboxes(ctx, js, prefix)
	if err != nil || len(names) == 0 {
		return []string{wire.StreamIn}
	}
	return names
}

// isInbox reports whether name is one of the inbox streams.
func isInbox(name string) bool { _, ok := wire.InboxPrincipal(name); return ok }

// listFlag is a repeatable flag of values, each a value or a comma-separated
// list.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	*l = append(*l, splitList(v)...)
	return nil
}
