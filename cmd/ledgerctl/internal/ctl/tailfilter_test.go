package ctl

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/wire"
)

// A Subjects with no prefix means the default one: every filter tail
// builds from it starts with "ledger.log.", the task's too (it was
// ".log.*.<task>", which matches nothing).
func TestTailFiltersOfTheDefaultPrefix(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		partition int
		task      string
		want      []string
	}{
		{-1, "", []string{"ledger.log.>"}},
		{3, "", []string{"ledger.log.3.*"}},
		{-1, "report-1", []string{"ledger.log.*.report-1", "ledger.log.*.~batch"}},
		{3, "report-1", []string{"ledger.log.3.report-1", "ledger.log.3.~batch"}},
	} {
		require.Equal(t, c.want, logFilters(wire.Subjects{}, c.partition, c.task))
	}
}
