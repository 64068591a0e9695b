//go:build ledger_noresend

package worker

// resendUnknown is off in this build (tag ledger_noresend): the negative
// control of the chaos run's storage loss. Never ship it.
const resendUnknown = false
