package ingest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/wire"
)

// Two ingests may mirror one partition's changes out of order: the view
// keeps the later state.
func TestLeaseViewKeepsTheLaterStateOfAPartition(t *testing.T) {
	t.Parallel()
	at := func(g int64, expires string) wire.LeaseView {
		return wire.LeaseView{Partition: 1, Holder: "p.a", Generation: g, ExpiresAt: expires}
	}
	released := func(g int64) wire.LeaseView {
		return wire.LeaseView{Partition: 1, Holder: "p.a", Generation: g, Released: true}
	}
	for _, c := range []struct {
		name  string
		a, b  wire.LeaseView
		newer bool
	}{
		{"higher generation", at(3, "2026-12-01T10:00:00Z"), at(2, "2026-12-01T11:00:00Z"), true},
		{"lower generation", at(2, "2026-12-01T11:00:00Z"), at(3, "2026-12-01T10:00:00Z"), false},
		{"later renewal", at(2, "2026-12-01T10:00:00.51Z"), at(2, "2026-12-01T10:00:00.5Z"), true},
		{"earlier renewal", at(2, "2026-12-01T10:00:00.5Z"), at(2, "2026-12-01T10:00:00.51Z"), false},
		{"same renewal", at(2, "2026-12-01T10:00:00.5Z"), at(2, "2026-12-01T10:00:00.5Z"), false},
		{"release after renewal", released(2), at(2, "2026-12-01T10:00:00Z"), true},
		{"renewal after release", at(2, "2026-12-01T10:00:00Z"), released(2), false},
		{"grant after release", at(3, "2026-12-01T10:00:00Z"), released(2), true},
	} {
		require.Equal(t, c.newer, newerView(c.a, c.b), c.name)
	}
}
