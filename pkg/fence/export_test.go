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
