// Package wire is the ledger's public contract in Go (docs/contract.md):
// NATS subjects, stream and bucket names, message headers, verdicts and
// their reasons, identifier rules, the JSON bodies of the lease service,
// and the one encoding of each message: inbound events (Inbound,
// DecodeInbound), batches of them (BatchMsg, DecodeBatch), LEDGER_LOG
// copies (LogCopy, LogMsg, DecodeLog), receipts (AppendReceipt,
// DecodeReceipt; batched: ReceiptsMsg, DecodeReceipts) and dead letters
// (DeadLetterMsg, DecodeDeadLetter).
//
// Every side of the system (ingest, projector, the worker SDK, ledgerctl and
// the tests) builds and reads the contract's messages here so that they
// cannot drift apart. The package does no I/O and imports nothing else of
// the project.
package wire

// ContractVersion is the version of the wire contract (docs/contract.md)
// this package encodes. The modules pkg/wire and pkg/worker are released
// together, tagged pkg/wire/v0.<ContractVersion>.N and
// pkg/worker/v0.<ContractVersion>.N: while they are v0, the minor version
// is the contract's, so an SDK of v0.3.x speaks to any ledger of contract
// v3 and a bump of the minor version says the wire changed.
const ContractVersion = 3
