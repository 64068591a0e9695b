// Package console is the ledger's web console, served by "ledgerctl
// console": a live picture of the partitions' leases and takeovers, the
// flow of verdicts, the dead letters and one task at a time, for the
// operator who would otherwise run "ledgerctl leases", "dlq list" and
// "task" one after the other.
//
// It reads what ledgerctl reads, through the same code (the Ledger
// interface, implemented by package ctl): leases and tasks from
// PostgreSQL, dead letters from LEDGER_DLQ decoded with wire's codec, and
// a replay is "ledgerctl dlq replay". Beside them it watches, with no help
// from the services: ledger.events and ledger.lease_grants by time,
// LEDGER_DLQ as it grows, the projector's consumers on LEDGER_LOG and its
// open-gap markers, and, when told where, the ingest's /metrics.
//
// What an operator can rely on:
//   - It listens on 127.0.0.1 unless told otherwise, and answers only
//     requests whose Host names the address it listens on (a page elsewhere
//     cannot reach it through DNS rebinding).
//   - It is read-only: no GET changes anything, and the only write, a
//     replay, exists only with Config.AllowReplay, as a POST that carries a
//     token bound to a per-process secret and to a SameSite cookie, from a
//     page of the console's own origin (Origin and Sec-Fetch-Site are
//     checked), so another site cannot forge one.
//   - Pages carry no secrets: no connection string, password or token of
//     the ledger's services appears in a page or a URL.
//   - Everything a worker wrote (ids, holders, types, headers, bodies) is
//     escaped by html/template, and the pages run no script but the
//     console's own (Content-Security-Policy script-src 'self').
//   - Pages are complete without JavaScript (they refresh themselves every
//     few seconds); with it, they follow server-sent events, or poll when
//     those fail, and stay at most PollInterval behind.
package console
