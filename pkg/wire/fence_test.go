package wire_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowness/ledger/pkg/wire"
)

func TestFenceRoundTrips(t *testing.T) {
	t.Parallel()
	f := wire.Fence{Partition: 3, Holder: "reports.pod-a", Generation: 42}
	require.Equal(t, "3:reports.pod-a:42", f.String())
	got, err := wire.ParseFence(f.String())
	require.NoError(t, err)
	require.Equal(t, f, got)
	require.True(t, got.Valid())
}

func TestParseFenceRefusesWhatIsNotPlain(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		"", "3", "3:reports.pod-a", "3:reports.pod-a:42:1", "+3:reports.pod-a:42", "-3:reports.pod-a:42",
		"03:reports.pod-a:42", "3:reports.pod-a:042", "3:reports.pod-a:0", "3:reports.pod-a:-1",
		"3:reports.pod-a: 42", " 3:reports.pod-a:42", "3:reports:42", "3:a.b.c:42", "3:a.*:42",
		"1073741825:a.b:1", "3:a.b:9999999999999999999", "3:a.b:1e3", "3:a.b:٣",
	} {
		_, err := wire.ParseFence(s)
		require.Error(t, err, "%q", s)
		require.True(t, errors.Is(err, wire.ErrBadFence), "%q: %v", s, err)
	}
}

func TestFenceSupersedesOnlyALowerGenerationOfItsPartition(t *testing.T) {
	t.Parallel()
	old := wire.Fence{Partition: 1, Holder: "p.a", Generation: 4}
	require.True(t, wire.Fence{Partition: 1, Holder: "p.b", Generation: 5}.Supersedes(old))
	require.False(t, wire.Fence{Partition: 1, Holder: "p.b", Generation: 4}.Supersedes(old))
	require.False(t, wire.Fence{Partition: 2, Holder: "p.b", Generation: 9}.Supersedes(old))
}

// FuzzParseFence: a downstream service parses whatever a caller sent in
// Ledger-Fence. The parser never panics, accepts only a valid fence, and
// what it accepts is exactly the rendering of the result.
func FuzzParseFence(f *testing.F) {
	for _, s := range []string{"3:reports.pod-a:42", "0:a.b:1", "1073741824:a.b:999999999999999999",
		"03:a.b:1", "3:a.b:01", "3:a:1", "3:a.b:0", ":a.b:1", "3::1", "3:a.b:", "3:a.b:1:", "3:a.b.c:1", "3:ü.b:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fence, err := wire.ParseFence(s)
		if err != nil {
			if !errors.Is(err, wire.ErrBadFence) {
				t.Fatalf("%q: error %v does not wrap ErrBadFence", s, err)
			}
			return
		}
		if !fence.Valid() {
			t.Fatalf("%q parsed to an invalid fence %+v", s, fence)
		}
		if fence.String() != s {
			t.Fatalf("%q parsed to %+v, which renders %q", s, fence, fence.String())
		}
	})
}
