package fence

import "bytes"

// Unfenced returns a copy of s with the fence switched off: no lease lock, no
// stale classification, no fence predicate in the insert. Only the negative
// control of the commit-order race test uses it, to prove that the test's
// checker reports the violations the fence prevents.
func Unfenced(s *Store) *Store {
	c := *s
	c.hooks.unfenced = true
	return &c
}

// BeforeWrite returns a copy of s that calls fn in every append attempt
// between its reads (leases locked, heads read) and its write (the fenced
// insert and COMMIT).
func BeforeWrite(s *Store, fn func()) *Store {
	c := *s
	c.hooks.beforeWrite = fn
	return &c
}

// SharedRejectionLocks returns a copy of s that records rejections under the
// shared lease locks of every append instead of locking the partitions
// exclusively first: the negative control of the finality test.
func SharedRejectionLocks(s *Store) *Store {
	c := *s
	c.hooks.sharedRejections = true
	return &c
}

// AllRejectionsExclusive returns a copy of s that decides every batch that
// records a rejection under FOR UPDATE lease locks, as before verdicts no
// other append can undo were recorded under the shared locks.
func AllRejectionsExclusive(s *Store) *Store {
	c := *s
	c.hooks.allRejectionsExclusive = true
	return &c
}

// NormalizePayload is normalizePayload, for the fuzz targets.
func NormalizePayload(p []byte, max int) ([]byte, error) { return normalizePayload(p, max) }

// UnserialisedHeads returns a copy of s whose inserts move a task's head
// whatever version it is at, instead of only from the version the batch
// planned from: the negative control of the test that writers racing on
// one task are serialised.
func UnserialisedHeads(s *Store) *Store {
	c := *s
	c.hooks.unserialised = true
	return &c
}

// HeadsFromLog returns a copy of s that reads task heads from the hot log,
// as before ledger.heads: the negative control of the test that archived
// versions stay taken.
func HeadsFromLog(s *Store) *Store {
	c := *s
	c.hooks.headsFromLog = true
	return &c
}

// WithoutIDFloor returns a copy of s that does not refuse event ids minted
// before the archive horizon's id floor: the negative control of the test
// that an archived id never commits again.
func WithoutIDFloor(s *Store) *Store {
	c := *s
	c.hooks.noIDFloor = true
	return &c
}

// ArchiveSeams returns a copy of s whose archives lose each partition's
// first row on the way to its file (loseRow), do not read the file back
// (unchecked), or read the rows before the detach waited for their writers
// (copyFirst, unchecked too): the negative controls of the archive tests.
func ArchiveSeams(s *Store, loseRow, unchecked, copyFirst bool) *Store {
	c := *s
	c.hooks.archiveLoseRow, c.hooks.archiveUnchecked, c.hooks.archiveCopyFirst = loseRow, unchecked, copyFirst
	return &c
}

// WithoutPartitionKeeping returns a copy of s whose appends never make
// partitions of ledger.events: the negative control of the test that they
// do.
func WithoutPartitionKeeping(s *Store) *Store {
	c := *s
	c.hooks.noPartitionKeeping = true
	return &c
}

// EncodeArchiveLine is encodeArchiveLine, for the fuzz targets.
func EncodeArchiveLine(c Committed) []byte {
	var b bytes.Buffer
	if err := encodeArchiveLine(&b, &c); err != nil {
		panic(err)
	}
	return b.Bytes()
}

// The statements of TaskHead and TaskHeads, for the test of their plans.
const (
	SQLTaskHead          = sqlTaskHead
	SQLTaskHeads         = sqlTaskHeads
	SQLTaskHeadsArchived = sqlTaskHeadsArchived
)

// WithoutFastPath returns a copy of s whose appends always read before they
// write: the careful path alone, for benchmarks and negative controls.
func WithoutFastPath(s *Store) *Store {
	c := *s
	c.hooks.noFast = true
	return &c
}

// WithoutClaimCheck returns a copy of s whose appends do not check the
// ingest claims they are made under: the negative control of the test
// that an ingest that lost a partition commits nothing for it.
func WithoutClaimCheck(s *Store) *Store {
	c := *s
	c.hooks.noClaimCheck = true
	return &c
}

// SetTimeoutsSQL is the statement that bounds an append's transaction.
const SetTimeoutsSQL = sqlSetTimeouts

// WithoutReplan returns a copy of s whose connections keep the plans they
// made first, however the tables grow (replan.go).
func WithoutReplan(s *Store) *Store {
	c := *s
	c.hooks.noReplan = true
	return &c
}

// SQLAppendHeads is the statement appends read task heads with.
const SQLAppendHeads = sqlAppendHeads
