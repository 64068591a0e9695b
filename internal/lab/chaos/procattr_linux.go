package chaos

import "syscall"

// childAttr puts a child in its own process group, so a terminal's Ctrl-C
// reaches only ledgerlab (which stops the run in order), and kills it if
// ledgerlab dies.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
