//go:build !ledger_noresend

package worker

// resendUnknown switches Client.publishAgain on. The build tag
// ledger_noresend switches it off, for the chaos run's negative control
// only: an SDK built so loses the events a storage loss took.
const resendUnknown = true
