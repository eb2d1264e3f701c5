package postgres_test

import (
	"context"
	"testing"

	"go.uber.org/goleak"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/drivertest"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/internal/testdb"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestConformance(t *testing.T) {
	drivertest.Run(t, func(t *testing.T, o drivertest.Options) *drivertest.DB {
		return setup(t, o, false)
	})
}

// TestConformancePipelinedClaims runs the relay checks again with claims
// sent the way a relay on the pgx driver sends them (PgxDriver.ClaimOutbox).
func TestConformancePipelinedClaims(t *testing.T) {
	t.Parallel()
	drivertest.Relay(t, func(t *testing.T, o drivertest.Options) *drivertest.DB {
		return setup(t, o, true)
	})
}

func setup(t *testing.T, o drivertest.Options, pipelined bool) *drivertest.DB {
	pg := testdb.NewPostgres(t, testdb.Options{NoMigrate: o.NoMigrate})
	db := &drivertest.DB{
		Driver:            postgres.NewSQL(pg.DB),
		IsUniqueViolation: func(err error) bool { return postgres.IsUniqueViolation(err, "") },
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
		Conns: []drivertest.Conn{drivertest.ConnOf("pgx", pg.Driver)},
	}
	if pipelined {
		db.Claimer = pg.Driver
	}
	return db
}
