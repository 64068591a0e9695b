package admin

import (
	"log/slog"
	"sync"
	"time"
)

// failureLogEvery is how often the same failure of the same check is
// logged again while it lasts: probes ask every few seconds, and one line a
// minute says the same without flooding the log.
const failureLogEvery = time.Minute

// failureLogMax bounds how many distinct failures are remembered. Error
// texts can vary without end (an address, a counter); past the bound the
// oldest is forgotten, which at worst logs it again.
const failureLogMax = 128

// failureLog writes a readiness check's error to the service's log, at most
// once per failureLogEvery for each distinct check and error text.
type failureLog struct {
	log *slog.Logger
	now func() time.Time

	mu     sync.Mutex
	logged map[failureKey]time.Time
}

type failureKey struct{ check, err string }

func newFailureLog(log *slog.Logger, now func() time.Time) *failureLog {
	return &failureLog{log: log, now: now, logged: map[failureKey]time.Time{}}
}

func (f *failureLog) report(check string, err error) {
	key := failureKey{check, err.Error()}
	now := f.now()
	f.mu.Lock()
	last, seen := f.logged[key]
	if seen && now.Sub(last) < failureLogEvery {
		f.mu.Unlock()
		return
	}
	f.forgetOld(now)
	f.logged[key] = now
	f.mu.Unlock()
	f.log.Warn("readiness check failed", slog.String("check", check), slog.String("error", key.err))
}

// forgetOld drops what can be logged again anyway, and the oldest entry if
// the map is still full. The caller holds f.mu.
func (f *failureLog) forgetOld(now time.Time) {
	var oldest failureKey
	var oldestAt time.Time
	for k, at := range f.logged {
		if now.Sub(at) >= failureLogEvery {
			delete(f.logged, k)
			continue
		}
		if oldestAt.IsZero() || at.Before(oldestAt) {
			oldest, oldestAt = k, at
		}
	}
	if len(f.logged) >= failureLogMax {
		delete(f.logged, oldest)
	}
}
