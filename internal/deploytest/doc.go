// Package deploytest checks the deployment files against the code they
// configure. It holds only tests:
//
//   - Dockerfile and docker-compose.yml: every service runs a binary the image
//     builds, with flags and environment variables that binary documents in
//     its -h output; JetStream, monitoring, ports, healthchecks and start
//     order are as docs/operations.md describes.
//   - migrations/00002_roles.sql, 00004_connect.sql and
//     deploy/postgres/roles.sql: the group roles allow what each service
//     does, through the real fence.Store, and nothing that rewrites history
//     (DELETE, TRUNCATE, UPDATE of events); only they connect to the
//     ledger's database; migrations refuse to run as them.
//   - NATS authorization: both deployments `ledgerctl auth` writes (static
//     nkey users, operator mode with JWTs) are loaded into an embedded server
//     that runs the real ingest, projector, worker SDK, readers and
//     ledgerctl; honest flows work end to end and every attack of
//     docs/security.md is refused. deploy/nats/auth.conf is the generator's
//     output, the cluster files and deploy/nats-jwt are valid, and the
//     security guide cites only tests that exist.
//
// Nothing here needs Docker or a network: PostgreSQL comes from
// internal/dbtest and NATS from internal/natstest. If the docker compose
// plugin is installed, the compose file is also checked with
// `docker compose config`.
package deploytest
