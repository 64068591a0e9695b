// Package e2e holds the end-to-end tests of the whole ledger: worker SDK →
// NATS → ingest → PostgreSQL → committed log → projector → KV bucket, on a
// real PostgreSQL and an embedded NATS server. It has no non-test code.
package e2e
