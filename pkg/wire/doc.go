// Package wire holds the names and shapes of the ledger's public contract
// (CONTRACT.md v1): NATS subjects, stream and bucket names, message headers,
// verdicts and their reasons, identifier rules, and the JSON bodies of the
// lease service and of receipts.
//
// Every side of the system (ingest, projector, the worker SDK, ledgerctl and
// the tests) takes these names from here so that they cannot drift apart.
// The package does no I/O and imports nothing else of the project.
package wire
