package fence

import "sync"

// HeadCacheSizeDefault is how many task heads a Store remembers: 100,000.
const HeadCacheSizeDefault = 100_000

// headCache remembers the heads this process committed, so that a batch of
// tasks it already knows skips the per-task index probes.
//
// A cached head is never above the truth: it is written only after a commit,
// and heads only rise. A head that another process moved on is below the
// truth, and that is safe: an event planned as head + 1 hits the unique index
// and the batch is retried with heads read from the database; an event that
// would not commit is never decided from the cache (see appendOnce).
type headCache struct {
	mu  sync.Mutex
	m   map[string]taskHead
	max int
}

func newHeadCache(max int) *headCache {
	return &headCache{m: make(map[string]taskHead), max: max}
}

// lookup fills heads with the cached tasks and returns the others.
func (c *headCache) lookup(tasks []string, heads map[string]taskHead) (missing []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range tasks {
		if h, ok := c.m[t]; ok {
			heads[t] = h
		} else {
			missing = append(missing, t)
		}
	}
	return missing
}

// raise records committed heads, keeping the higher of old and new.
func (c *headCache) raise(heads map[string]taskHead) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t, h := range heads {
		if old, ok := c.m[t]; ok && old.version >= h.version {
			continue
		}
		if len(c.m) >= c.max {
			c.shed()
		}
		c.m[t] = h
	}
}

// forget drops tasks whose head is in doubt.
func (c *headCache) forget(tasks []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range tasks {
		delete(c.m, t)
	}
}

// shed drops about a tenth of the entries (Go's map order is random enough
// for a cache whose misses cost one index probe).
func (c *headCache) shed() {
	n := c.max/10 + 1
	for t := range c.m {
		delete(c.m, t)
		if n--; n == 0 {
			return
		}
	}
}
