package fence

// hooks are the test seams of a Store. Each switches one mechanism off, so
// that a test's negative control can show the test fails without it. Only
// export_test.go sets them, and the build tag ledger_nofence sets unfenced
// (nofence_chaos.go). The zero value is production.
type hooks struct {
	// unfenced switches the fence off: no lease lock, no stale verdict, no
	// fence predicate in the insert.
	unfenced bool
	// beforeWrite runs between an append's reads and its write.
	beforeWrite func()
	// sharedRejections records rejections under the shared lease locks of
	// every append, as before finality was enforced.
	sharedRejections bool
	// allRejectionsExclusive takes the exclusive lease locks for every
	// rejection, also those no other append can undo (plan.undoable).
	allRejectionsExclusive bool
	// unserialised, headsFromLog and noIDFloor switch off what keeps
	// versions dense and ids unique across writers and archived history.
	unserialised, headsFromLog, noIDFloor bool
	// archiveLoseRow, archiveUnchecked and archiveCopyFirst make an archive
	// lose a partition's first row on its way to the file, skip reading the
	// file back, and read the rows before the detach has waited for their
	// writers (unchecked too).
	archiveLoseRow, archiveUnchecked, archiveCopyFirst bool
	// noPartitionKeeping stops appends from making partitions of
	// ledger.events.
	noPartitionKeeping bool
	// noFast keeps every append on the careful path.
	noFast bool
	// noClaimCheck appends without checking the ingest claims.
	noClaimCheck bool
	// noReplan keeps the plans a connection made first (replan.go).
	noReplan bool
}
