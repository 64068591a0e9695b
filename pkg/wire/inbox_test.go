package wire_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/wire"
)

// An inbox stream's name tells whose events it holds: LEDGER_IN every
// principal's, LEDGER_IN_<principal> that principal's; any other name is
// no inbox, and a principal's inbox name reads back to the principal.
func TestInboxStreamNamesItsPrincipal(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]string{
		"LEDGER_IN": "*", "LEDGER_IN_reports": "reports", "LEDGER_IN_a_b-c": "a_b-c",
		"LEDGER_IN_": "", "LEDGER_IN_a.b": "", "LEDGER_LOG": "", "LEDGER_INX": "", "": "",
	} {
		got, ok := wire.InboxPrincipal(name)
		require.Equal(t, want != "", ok, name)
		require.Equal(t, want, got, name)
	}
	got, ok := wire.InboxPrincipal(wire.InboxStream("billing"))
	require.True(t, ok)
	require.Equal(t, "billing", got)
	s := wire.Subjects{}
	require.Equal(t, "ledger.in.billing.*.3.*", s.InPrincipalPartition("billing", 3))
	require.Equal(t, "ledger.in.billing.*.3", s.InPrincipalBatchPartition("billing", 3))
	require.Equal(t, s.InPartition(3), s.InPrincipalPartition("*", 3))
}
