package store

import (
	"context"

	"github.com/jackc/pgx/v5"
)

type pgxConnConfig = pgx.ConnConfig

func connectPG(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	return pgx.ConnectConfig(ctx, cfg)
}
