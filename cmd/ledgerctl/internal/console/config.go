package console

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"
)

// Defaults of Config.
const (
	// ListenDefault is where the console listens: loopback only,
	// 127.0.0.1:9092 (the ingest's admin port is 9090, the projector's 9091).
	ListenDefault = "127.0.0.1:9092"
	// PollIntervalDefault is how often the live views are recomputed and
	// pushed: 1 s.
	PollIntervalDefault = time.Second
	// FlowWindowDefault is how far back the flow charts reach: 10 min.
	FlowWindowDefault = 10 * time.Minute
	// DLQScanDefault is how many of the newest dead letters the dead-letter
	// view reads and groups: 10,000.
	DLQScanDefault = 10_000
	// DLQShowDefault is how many dead letters a list shows: 200.
	DLQShowDefault = 200
	// ReplayWaitDefault is how long a replay waits for the new verdict: 5 s.
	ReplayWaitDefault = 5 * time.Second
)

// Config configures a console. The zero value serves on ListenDefault,
// read-only.
type Config struct {
	// Listen is the TCP address to serve on; default ListenDefault.
	Listen string
	// Hosts are extra host names (or host:port) the console answers to,
	// besides its listen address (and localhost when that is loopback).
	// Requests naming any other Host are refused, so a page on another
	// site cannot reach the console by DNS rebinding. Default none; when
	// Listen is a wildcard address (0.0.0.0) and Hosts is empty, any Host
	// is accepted.
	Hosts []string
	// AllowReplay enables the replay of dead letters. Default false: the
	// console changes nothing.
	AllowReplay bool
	// PollInterval is how often the live views are recomputed; default
	// PollIntervalDefault.
	PollInterval time.Duration
	// FlowWindow is the time the flow charts cover; default
	// FlowWindowDefault.
	FlowWindow time.Duration
	// DLQScan bounds the dead letters read for one view of the list;
	// default DLQScanDefault.
	DLQScan int
	// DLQShow is how many dead letters a list shows; default DLQShowDefault.
	DLQShow int
	// ReplayWait is how long a replay waits for its new verdict; default
	// ReplayWaitDefault.
	ReplayWait time.Duration
	// IngestMetrics are URLs of the ingests' /metrics, scraped every
	// PollInterval for what only the ingest counts (duplicates). Default
	// none: the flow view then says that duplicates are not shown.
	IngestMetrics []string
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.Listen = cmp.Or(c.Listen, ListenDefault)
	c.PollInterval = cmp.Or(c.PollInterval, PollIntervalDefault)
	c.FlowWindow = cmp.Or(c.FlowWindow, FlowWindowDefault)
	c.DLQScan = cmp.Or(c.DLQScan, DLQScanDefault)
	c.DLQShow = cmp.Or(c.DLQShow, DLQShowDefault)
	c.ReplayWait = cmp.Or(c.ReplayWait, ReplayWaitDefault)
	return c
}

func (c Config) validate() error {
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("listen address %q: %w", c.Listen, err)
	}
	switch {
	case c.PollInterval < 100*time.Millisecond:
		return errors.New("the poll interval must be at least 100ms")
	case c.FlowWindow < time.Minute || c.FlowWindow > 24*time.Hour:
		return errors.New("the flow window must be between 1m and 24h")
	case c.DLQScan < 1 || c.DLQShow < 1:
		return errors.New("the dead-letter scan and list sizes must be positive")
	case c.ReplayWait < 0:
		return errors.New("the replay wait must not be negative")
	}
	for _, u := range c.IngestMetrics {
		p, err := url.Parse(u)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return fmt.Errorf("ingest metrics URL %q is not an http(s) URL", u)
		}
	}
	return nil
}
