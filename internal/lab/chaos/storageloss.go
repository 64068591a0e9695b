package chaos

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// loseNATSStorage stops the ingests for 1.5 s (SIGSTOP), then kills the
// NATS server (with Cluster, a random node) with SIGKILL and damages its
// store before it starts again 1 s later, as a power loss or a failing disk
// would: the newest block file of every stream is cut short (the writes
// not yet synced are gone), or, on a cluster every other time, a block in
// the middle of one stream's files gets 64 bytes overwritten. The store's
// index files are left as they were: the server must notice the files
// disagree with them.
func (r *run) loseNATSStorage(ctx context.Context) {
	i := 0
	if r.o.Cluster {
		i = r.pick(len(r.nodes))
	}
	n := r.nodes[i]
	store := filepath.Join(r.dir, "nats", n.name)
	// The ingests fall behind first, so the lost tail of LEDGER_IN holds
	// events acknowledged to the writers and not yet decided. They run
	// again when the server dies: one frozen with a dead connection would
	// send its first copies before it noticed, and the client sends what it
	// buffered to the new server first.
	for _, in := range r.ingests {
		_ = in.signal(syscall.SIGSTOP)
	}
	pause(ctx, 1500*time.Millisecond)
	for _, in := range r.ingests {
		_ = in.signal(syscall.SIGCONT)
	}
	n.kill()
	r.mu.Lock()
	r.storageLosses++
	corrupt := r.o.Cluster && r.storageLosses%2 == 0
	r.mu.Unlock()
	var what string
	var err error
	if corrupt {
		what, err = r.corruptBlock(store)
	} else {
		what, err = cutTails(store, r.uniform(0.3, 0.8))
	}
	if err != nil {
		r.logf("storage loss on %s: %v", n.name, err)
	} else {
		r.logf("kill -9 %s; %s; restart in 1s", n.name, what)
	}
	pause(ctx, time.Second)
	if err := n.start(); err != nil {
		r.logf("restart %s: %v", n.name, err)
		return
	}
	r.logf("%s started", n.name)
}

// streamBlocks lists each stream's block files under a JetStream store,
// in block order.
func streamBlocks(store string) (map[string][]string, error) {
	paths, err := filepath.Glob(filepath.Join(store, "jetstream", "*", "streams", "*", "msgs", "*.blk"))
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, p := range paths {
		stream := filepath.Base(filepath.Dir(filepath.Dir(p)))
		out[stream] = append(out[stream], p)
	}
	for _, blocks := range out {
		slices.SortFunc(blocks, func(a, b string) int { return cmp.Compare(blockIndex(a), blockIndex(b)) })
	}
	return out, nil
}

func blockIndex(path string) int {
	n, _ := strconv.Atoi(strings.TrimSuffix(filepath.Base(path), ".blk"))
	return n
}

// cutTails cuts the newest block of every stream to frac of its size.
func cutTails(store string, frac float64) (string, error) {
	streams, err := streamBlocks(store)
	if err != nil {
		return "", err
	}
	var cut []string
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range streams {
			if !yield(k) {
				return
			}
		}
	}) {
		blocks := streams[name]
		last := blocks[len(blocks)-1]
		info, err := os.Stat(last)
		if err != nil || info.Size() == 0 {
			continue
		}
		keep := int64(float64(info.Size()) * frac)
		if err := os.Truncate(last, keep); err != nil {
			return "", err
		}
		cut = append(cut, fmt.Sprintf("%s %d→%d B", name, info.Size(), keep))
	}
	return "cut the tail of its stream files: " + strings.Join(cut, ", "), nil
}

// corruptBlock overwrites 64 bytes in the middle of a random non-empty
// block of a random stream.
func (r *run) corruptBlock(store string) (string, error) {
	streams, err := streamBlocks(store)
	if err != nil {
		return "", err
	}
	var blocks []string
	for _, bs := range streams {
		for _, b := range bs {
			if info, err := os.Stat(b); err == nil && info.Size() > 256 {
				blocks = append(blocks, b)
			}
		}
	}
	if len(blocks) == 0 {
		return "", fmt.Errorf("no block to corrupt in %s", store)
	}
	slices.Sort(blocks)
	b := blocks[r.pick(len(blocks))]
	f, err := os.OpenFile(b, os.O_RDWR, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return "", err
	}
	at := int64(float64(info.Size()-64) * r.uniform(0.25, 0.75))
	junk := make([]byte, 64)
	for i := range junk {
		junk[i] = byte(r.pick(256))
	}
	if _, err := f.WriteAt(junk, at); err != nil {
		return "", err
	}
	rel, _ := filepath.Rel(store, b)
	return fmt.Sprintf("corrupted 64 bytes at offset %d of %s", at, rel), nil
}
