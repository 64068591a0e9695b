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
//   - No user is in an account that holds a stream. LEDGER_IN and
//     LEDGER_DLQ (AccountLedger), LEDGER_LOG (AccountLog) and the
//     projector's buckets (AccountProjections) are reached only through
//     their exports; every role, each worker principal and reader too,
//     has an account of its own. Reply subjects are the requester's to
//     choose and nobody checks them; across an import the server rewrites
//     them, so every answer (JetStream's API, publish acks, direct gets,
//     lease replies) lands in the requester's own account, where no stream
//     of the ledger is and no other principal reads.
//   - A consumer delivers in its stream's account: the projector's
//     consumers are on the log and its own buckets, apart from LEDGER_IN,
//     LEDGER_DLQ and the receipts; the ingest's on LEDGER_IN, which the
//     server refuses to deliver into itself.
//   - The services create a missing stream but never update one: an update
//     could make a stream republish what it stores, or transform subjects.
//   - Readers get a projection by direct get and follow the bucket's
//     subjects; they have no JetStream API, so no consumer delivering
//     anywhere.
//   - The services' JetStream rights name their own streams, consumers and
//     buckets, and never delete or purge a stream of the ledger.
//   - With Setup.Inboxes, each worker principal's inbox LEDGER_IN_<principal>
//     is named one by one beside LEDGER_IN, with its confinement (a wildcard
//     would reach every stream of the account), and AccountLedger has room
//     for each (Setup.InboxMaxBytes).
//   - Secrets are written 0600. Running a command again reuses every key,
//     so servers and clients already using them go on working; only
//     MintUser replaces a credentials file, and the credentials it replaced
//     stay valid.
package natsauth
