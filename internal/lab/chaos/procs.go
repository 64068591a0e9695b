package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// proc is a child process of the run: a service, a nats-server node or a
// writer. It is restarted after restartDelay if it exits while it should be
// running (a supervisor's job in a real deployment); a kill by a fault is
// not such an exit.
type proc struct {
	name    string
	path    string
	args    []string
	logPath string
	// onExit reports an exit the run did not ask for.
	onExit func(p *proc, err error)

	mu      sync.Mutex
	cmd     *exec.Cmd
	want    bool          // should be running
	done    chan struct{} // closed when the current process has exited
	closing bool          // the run ends: no more restarts
}

// restartDelay is how long a process that exited on its own stays down.
const restartDelay = time.Second

func newProc(name, path, logPath string, onExit func(*proc, error), args ...string) *proc {
	done := make(chan struct{})
	close(done)
	return &proc{name: name, path: path, args: args, logPath: logPath, onExit: onExit, done: done}
}

// start starts the process; its output is appended to its log file.
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.startLocked()
}

func (p *proc) startLocked() error {
	select {
	case <-p.done:
	default:
		return fmt.Errorf("%s is already running", p.name)
	}
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("%s: log file: %w", p.name, err)
	}
	fmt.Fprintf(f, "--- chaos: %s start %s\n", time.Now().UTC().Format(time.RFC3339Nano), p.name)
	cmd := exec.Command(p.path, p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s (%s): %w", p.name, p.path, err)
	}
	done := make(chan struct{})
	p.cmd, p.done, p.want = cmd, done, true
	go p.wait(cmd, f, done)
	return nil
}

// wait reaps the process and restarts it if it should still be running.
func (p *proc) wait(cmd *exec.Cmd, f *os.File, done chan struct{}) {
	err := cmd.Wait()
	f.Close()
	p.mu.Lock()
	close(done)
	unexpected := p.want && !p.closing
	p.mu.Unlock()
	if !unexpected {
		return
	}
	if p.onExit != nil {
		p.onExit(p, err)
	}
	time.Sleep(restartDelay)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.want && !p.closing && p.cmd == cmd {
		if err := p.startLocked(); err != nil && p.onExit != nil {
			go p.onExit(p, err)
		}
	}
}

// signal sends sig to the running process.
func (p *proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		return fmt.Errorf("%s is not running", p.name)
	default:
	}
	return p.cmd.Process.Signal(sig)
}

// kill kills the process with SIGKILL and waits until it is gone.
func (p *proc) kill() {
	p.mu.Lock()
	p.want = false
	done, cmd := p.done, p.cmd
	p.mu.Unlock()
	select {
	case <-done:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGCONT) // a stopped process dies too, but say so
	_ = cmd.Process.Kill()
	<-done
}

// stop asks the process to exit (SIGTERM), and kills it after grace.
func (p *proc) stop(grace time.Duration) error {
	p.mu.Lock()
	p.want = false
	done, cmd := p.done, p.cmd
	p.mu.Unlock()
	select {
	case <-done:
		return nil
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
		return nil
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("%s did not exit within %v of SIGTERM; killed", p.name, grace)
	}
}

// close ends supervision: the process is not restarted any more.
func (p *proc) close() {
	p.mu.Lock()
	p.closing = true
	p.mu.Unlock()
}

// running reports whether the process is up.
func (p *proc) running() bool {
	_, ok := p.pid()
	return ok
}

// pid is the running process's id; ok is false when it is not running.
func (p *proc) pid() (pid int, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		return 0, false
	default:
		return p.cmd.Process.Pid, true
	}
}
