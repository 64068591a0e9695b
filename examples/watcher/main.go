// Command watcher is a read-side client of the ledger, to copy: it prints
// each task's projection (KV bucket ledger_tasks) as it changes.
//
// It reads the way docs/contract.md §9 lets a confined reader: the current
// value of each task named with -tasks by direct get
// ($JS.API.DIRECT.GET.KV_ledger_tasks.$KV.ledger_tasks.<task>), and every
// later change by subscribing to the bucket's subjects, $KV.ledger_tasks.>,
// with plain core NATS. It creates no consumer, so it needs no JetStream
// permission beyond direct get. A change can arrive twice or out of order
// around the first read, and the bucket may coalesce versions written
// together, so it prints a task only when its version moves forward.
//
//	go run ./examples/watcher -tasks report-1,report-2
//
// It imports only nats.go. It exits 0 on SIGTERM or SIGINT.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
)

// bucket is the projections' KV bucket; its name does not change with the
// subject prefix.
const bucket = "ledger_tasks"

// projection is the part of a ledger_tasks value the watcher prints (the
// whole value: docs/contract.md §6).
type projection struct {
	Task    string          `json:"task"`
	Version int64           `json:"version"`
	Status  string          `json:"status"`
	Data    json.RawMessage `json:"data"`
	Gap     *struct {
		NextVersion int64 `json:"next_version"`
	} `json:"gap"`
}

func main() {
	url := flag.String("nats-url", env("NATS_URL", nats.DefaultURL), "NATS servers (env NATS_URL)")
	creds := flag.String("nats-creds", os.Getenv("NATS_CREDS"), "NATS credentials file (env NATS_CREDS)")
	user := flag.String("nats-user", os.Getenv("NATS_USER"), "NATS user (env NATS_USER; the password from NATS_PASSWORD)")
	inbox := flag.String("inbox-prefix", os.Getenv("NATS_INBOX_PREFIX"), "prefix of this reader's reply subjects, as its permissions allow (env NATS_INBOX_PREFIX; default _INBOX)")
	tasks := flag.String("tasks", "", "comma-separated task ids to read at start")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	opts := []nats.Option{nats.Name("ledger-watcher"), nats.MaxReconnects(-1)}
	switch {
	case *creds != "":
		opts = append(opts, nats.UserCredentials(*creds))
	case *user != "":
		opts = append(opts, nats.UserInfo(*user, os.Getenv("NATS_PASSWORD")))
	}
	if *inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(*inbox))
	}
	if err := run(ctx, *url, opts, *tasks); err != nil {
		fmt.Fprintf(os.Stderr, "watcher: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, url string, opts []nats.Option, tasks string) error {
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return fmt.Errorf("connect to NATS: %w", err)
	}
	defer nc.Close()
	seen := map[string]int64{}
	changes := make(chan *nats.Msg, 1024)
	// Subscribe before the first reads, so no change falls between them.
	sub, err := nc.ChanSubscribe("$KV."+bucket+".>", changes)
	if err != nil {
		return fmt.Errorf("subscribe to %s changes: %w", bucket, err)
	}
	defer sub.Unsubscribe() //nolint:errcheck
	if err := nc.Flush(); err != nil {
		return err
	}
	for _, task := range strings.Split(tasks, ",") {
		if task == "" {
			continue
		}
		m, err := get(ctx, nc, task)
		switch {
		case err != nil:
			return err
		case m == nil:
			say("%s: no projection yet", task)
		default:
			show(seen, task, m)
		}
	}
	say("watching %s", bucket)
	for {
		select {
		case <-ctx.Done():
			say("stopped")
			return nil
		case m := <-changes:
			show(seen, strings.TrimPrefix(m.Subject, "$KV."+bucket+"."), m)
		}
	}
}

// get reads a task's current value by direct get of the last message on
// its key's subject; nil if the task has none.
func get(ctx context.Context, nc *nats.Conn, task string) (*nats.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET.KV_"+bucket+".$KV."+bucket+"."+task, nil)
	if err != nil {
		return nil, fmt.Errorf("direct get of %s: %w", task, err)
	}
	switch m.Header.Get("Status") {
	case "":
		return m, nil
	case "404":
		return nil, nil
	default:
		return nil, fmt.Errorf("direct get of %s: status %s %s", task, m.Header.Get("Status"), m.Header.Get("Description"))
	}
}

// show prints a value of task if it moves the task's version forward.
func show(seen map[string]int64, task string, m *nats.Msg) {
	if line, ok := describe(seen, task, m.Header.Get("KV-Operation"), m.Data); ok {
		say("%s", line)
	}
}

// describe is the line a change of task prints, and false when it prints
// nothing (a version already shown). Everything that came over the wire
// is made printable first: a value is written by the projector, but its
// data is whatever workers published, and a terminal must not take a
// control sequence from it.
func describe(seen map[string]int64, task, op string, data []byte) (string, bool) {
	task = printable(task)
	if op == "DEL" || op == "PURGE" {
		delete(seen, task)
		return fmt.Sprintf("%s: deleted (%s)", task, printable(op)), true
	}
	var p projection
	if err := json.Unmarshal(data, &p); err != nil {
		return fmt.Sprintf("%s: value that is not a projection (%s): %.80q", task, printable(err.Error()), data), true
	}
	if v, ok := seen[task]; ok && p.Version <= v {
		return "", false
	}
	seen[task] = p.Version
	gap := ""
	if p.Gap != nil {
		gap = fmt.Sprintf(", waiting for version %d", p.Gap.NextVersion)
	}
	return fmt.Sprintf("%s: version %d %s %s%s", task, p.Version, printable(p.Status), printable(string(p.Data)), gap), true
}

// printable replaces every rune a terminal could act on (control
// characters, C1 controls, invalid UTF-8, bidirectional overrides) with
// its \u escape.
func printable(s string) string {
	var b strings.Builder
	for _, r := range s {
		if unicode.IsPrint(r) && r != utf8.RuneError {
			b.WriteRune(r)
		} else {
			fmt.Fprintf(&b, "\\u%04x", r)
		}
	}
	return b.String()
}

func say(format string, args ...any) {
	fmt.Printf("%s watcher %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
