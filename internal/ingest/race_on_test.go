//go:build race

package ingest_test

// raceEnabled: the race detector slows every goroutine, the embedded NATS
// server's included, several times.
const raceEnabled = true
