package natstest

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// maxRecentErrors is how many error lines a tbLogger keeps for failure
// messages.
const maxRecentErrors = 10

// tbLogger is a server.Logger that writes to t.Log when enabled and always
// remembers fatal and recent error lines, so start failures can be reported
// and Fatalf never exits the test binary (the server's own loggers call
// os.Exit on Fatalf).
type tbLogger struct {
	tb      testing.TB
	prefix  string
	enabled bool

	mu       sync.Mutex
	closed   bool // the test is over: t.Log would panic
	fatalMsg string
	errs     []string
}

func newLogger(tb testing.TB, enabled bool, prefix string) *tbLogger {
	return &tbLogger{tb: tb, enabled: enabled, prefix: prefix}
}

func (l *tbLogger) logf(level, format string, v []any) string {
	msg := fmt.Sprintf(format, v...)
	if l.enabled {
		l.mu.Lock()
		if !l.closed {
			l.tb.Log(l.prefix + level + msg)
		}
		l.mu.Unlock()
	}
	return msg
}

func (l *tbLogger) Noticef(format string, v ...any) { l.logf("[INF] ", format, v) }
func (l *tbLogger) Warnf(format string, v ...any)   { l.logf("[WRN] ", format, v) }
func (l *tbLogger) Debugf(format string, v ...any)  { l.logf("[DBG] ", format, v) }
func (l *tbLogger) Tracef(format string, v ...any)  { l.logf("[TRC] ", format, v) }

func (l *tbLogger) Errorf(format string, v ...any) {
	msg := l.logf("[ERR] ", format, v)
	l.mu.Lock()
	l.errs = append(l.errs, msg)
	if len(l.errs) > maxRecentErrors {
		l.errs = l.errs[len(l.errs)-maxRecentErrors:]
	}
	l.mu.Unlock()
}

func (l *tbLogger) Fatalf(format string, v ...any) {
	msg := l.logf("[FTL] ", format, v)
	l.mu.Lock()
	if l.fatalMsg == "" {
		l.fatalMsg = msg
	}
	l.errs = append(l.errs, msg)
	l.mu.Unlock()
}

// fatal returns the first fatal message since the last resetFatal.
func (l *tbLogger) fatal() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fatalMsg
}

func (l *tbLogger) resetFatal() {
	l.mu.Lock()
	l.fatalMsg = ""
	l.errs = nil
	l.mu.Unlock()
}

func (l *tbLogger) recentErrors() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errs) == 0 {
		return "none (use natstest.WithLogging for the full server log)"
	}
	return strings.Join(l.errs, "; ")
}

// close stops forwarding to t.Log; called once the server is shut down in
// the test's cleanup.
func (l *tbLogger) close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
}
