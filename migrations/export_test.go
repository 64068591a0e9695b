package migrations

import (
	"context"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
)

// UpFS is Up on the migrations of fsys, without the migrator check.
func UpFS(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, logger *slog.Logger) ([]int64, error) {
	ms, err := load(fsys)
	if err != nil {
		return nil, err
	}
	return apply(ctx, pool, ms, logger)
}
