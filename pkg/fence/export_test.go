package fence

// Unfenced returns a copy of s with the fence switched off: no lease lock, no
// stale classification, no fence predicate in the insert. Only the negative
// control of the commit-order race test uses it, to prove that the test's
// checker reports the violations the fence prevents.
func Unfenced(s *Store) *Store {
	c := *s
	c.unfenced = true
	return &c
}

// BeforeWrite returns a copy of s that calls fn in every append attempt
// between its reads (leases locked, heads read) and its write (the fenced
// insert and COMMIT).
func BeforeWrite(s *Store, fn func()) *Store {
	c := *s
	c.beforeWrite = fn
	return &c
}

// SharedRejectionLocks returns a copy of s that records rejections under the
// shared lease locks of every append instead of locking the partitions
// exclusively first: the negative control of the finality test.
func SharedRejectionLocks(s *Store) *Store {
	c := *s
	c.sharedRejections = true
	return &c
}

// NormalizePayload is normalizePayload, for the fuzz targets.
func NormalizePayload(p []byte, max int) ([]byte, error) { return normalizePayload(p, max) }
