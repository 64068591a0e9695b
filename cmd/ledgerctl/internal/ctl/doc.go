// Package ctl implements ledgerctl, the ledger's admin command line: one
// function per subcommand behind a dispatcher, so that every command can be
// driven from a test exactly as the binary drives it (Run).
//
// Conventions every command keeps:
//   - Flags may come before or after the command name; the connection flags
//     of internal/connect, -prefix and -json are accepted by every command.
//   - Output is an aligned table on stdout, or with -json one JSON object per
//     line. Diagnostics go to stderr.
//   - Exit status: 0 success, 1 failure (a service unreachable, a missing
//     stream or schema, an operation that did not do what was asked), 2 a
//     usage error (unknown command, bad flag or argument).
//   - Reading commands never change state: dlq list reads LEDGER_DLQ with an
//     ordered consumer (ephemeral, no acks), tail reads LEDGER_LOG the same
//     way.
package ctl
