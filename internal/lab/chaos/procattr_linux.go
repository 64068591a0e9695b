package chaos

import "syscall"

// childAttr puts a child in its own process group, so a terminal's Ctrl-C
// reaches only ledgerctl (which stops the run in order), and kills it if
// ledgerctl dies.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
