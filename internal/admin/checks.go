package admin

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"

	"github.com/flowness/ledger/migrations"
)

// ServiceChecks are the readiness checks of a ledger service: PostgreSQL
// answers, NATS is connected, the service's consumer is bound, and the
// schema is at the binary's migration version.
func ServiceChecks(pool *pgxpool.Pool, nc *nats.Conn, consumer func(context.Context) error) []Check {
	return []Check{
		{Name: "postgres", Func: func(ctx context.Context) error { return pool.Ping(ctx) }},
		{Name: "nats", Func: func(context.Context) error {
			if s := nc.Status(); s != nats.CONNECTED {
				return fmt.Errorf("connection is %s", s)
			}
			return nil
		}},
		{Name: "consumer", Func: consumer},
		{Name: "migrations", Func: func(ctx context.Context) error { return migrations.Check(ctx, pool) }},
	}
}
