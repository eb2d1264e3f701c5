package postgres_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/drivertest"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/internal/testdb"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestConformance runs the suite on both connection APIs: pgx (whose
// driver also listens for new outbox rows and claims in one round trip)
// and database/sql on the pgx stdlib driver.
func TestConformance(t *testing.T) {
	t.Run("pgx", func(t *testing.T) {
		t.Parallel()
		drivertest.Run(t, func(t *testing.T, o drivertest.Options) *drivertest.DB[pgx.Tx] {
			pg := testdb.NewPostgres(t, testdb.Options{NoMigrate: o.NoMigrate})
			return conformanceDB(pg, pg.Driver)
		})
	})
	t.Run("database_sql", func(t *testing.T) {
		t.Parallel()
		drivertest.Run(t, func(t *testing.T, o drivertest.Options) *drivertest.DB[*sql.Tx] {
			pg := testdb.NewPostgres(t, testdb.Options{NoMigrate: o.NoMigrate})
			return conformanceDB(pg, postgres.NewSQL(pg.DB))
		})
	})
}

func conformanceDB[TTx any](pg *testdb.PG, drv driver.Driver[TTx]) *drivertest.DB[TTx] {
	return &drivertest.DB[TTx]{
		Driver:            drv,
		Schema:            pg.Schema,
		IsUniqueViolation: func(err error, _, key string) bool { return postgres.IsUniqueViolation(err, key) },
		Session: func(ctx context.Context, ex driver.Executor) (int64, error) {
			var pid int64
			err := driver.QueryRow(ctx, ex, "SELECT pg_backend_pid()", nil, &pid)
			return pid, err
		},
		Blocking: func(ctx context.Context, pid int64) (bool, error) {
			var n int
			err := pg.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1::integer = ANY(pg_blocking_pids(pid))`, pid).Scan(&n)
			return n > 0, err
		},
		Features: drivertest.Features{
			Placeholders: drivertest.DollarNumbers,
			UUIDColumns:  true,
		},
	}
}
