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
		// Another program's outbox, as Debezium's article has it.
		TextIDs: `ALTER TABLE outbox ALTER COLUMN id TYPE varchar(64)`,
		Features: drivertest.Features{
			Placeholders: drivertest.DollarNumbers,
			UUIDColumns:  true,
		},
	}
}

// TestOutboxLeavesRoomForLeases: the outbox's pages keep room for the
// claims' leases (migration 0009), so that a claim's update can be
// heap-only and write no index entry.
func TestOutboxLeavesRoomForLeases(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	if n := pg.Count(t, "pg_class WHERE oid = 'outbox'::regclass AND 'fillfactor=70' = ANY(reloptions)"); n != 1 {
		t.Fatal("the migrated outbox has no fillfactor of 70")
	}
	// Claimed rows are updated in place (HOT) while their page has room:
	// counted in one transaction, which pg_stat_xact_user_tables sees at
	// once.
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, pg.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
			SELECT gen_random_uuid(), 'order', i::text, 'order.placed', '{}' FROM generate_series(1, 200) i`); err != nil {
			return err
		}
		// One row in ten: two or three on each page, as claims spread.
		if _, err := tx.Exec(ctx, `UPDATE outbox SET lease_owner = gen_random_uuid(), lease_until = now() + interval '1 minute'
			WHERE seq % 10 = 0`); err != nil {
			return err
		}
		var hot int64
		if err := tx.QueryRow(ctx, `SELECT n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relid = 'outbox'::regclass`).Scan(&hot); err != nil {
			return err
		}
		if hot != 20 {
			t.Errorf("%d of the 20 claimed rows updated heap-only, want all", hot)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
