// Package natsauth writes the NATS authorization of an authenticated ledger
// (contract §9) for `ledgerctl auth`: in the server's static configuration
// (Static: one nkey user each) or in operator mode (JWT, MintUser: accounts
// and users as JWTs, one scoped signing key per role).
//
// What it guarantees, in both modes:
//
//   - A worker's principal is its NATS user name. User U publishes only
//     <prefix>.in.U.>, <prefix>.lease.*.U.*, <prefix>.lease.get and
//     <prefix>.task.head, and subscribes only to <prefix>.receipt.U.> and
//     _INBOX.U.>. Names are one subject token (ValidName), because the
//     server splices them into subjects.
//   - Nobody subscribes to another's inbox or to _INBOX.> as a whole: every
//     user connects with an inbox prefix of its own (InboxPrefix), so the
//     services' deliveries of LEDGER_IN and LEDGER_LOG reach only them.
//   - Workers and each reader have accounts of their own, which reach the
//     ledger's account (AccountLedger) only through its exports. Reply
//     subjects are the requester's to choose and nobody checks them; across
//     an import the server rewrites them, so every answer (publish acks,
//     lease replies, direct gets) lands in the requester's own account.
//   - Readers get a projection by direct get and follow the bucket's
//     subjects; they have no JetStream API, so no consumer delivering
//     anywhere.
//   - The services' JetStream rights name their own streams, consumers and
//     buckets, and never delete or purge a stream of the ledger.
//   - Secrets are written 0600. Running a command again reuses every key,
//     so servers and clients already using them go on working; only
//     MintUser replaces a credentials file, and the credentials it replaced
//     stay valid.
package natsauth
