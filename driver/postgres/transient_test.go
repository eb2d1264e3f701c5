package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/internal/testdb"
)

// closedPort returns an address on which nothing listens.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// TestIsTransientRealErrors provokes, on the test server and on a closed
// port, the errors IsTransient must recognise, through pgx and
// database/sql.
func TestIsTransientRealErrors(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	pg.Exec(t, `CREATE TABLE counter (id integer PRIMARY KEY, n integer NOT NULL)`)
	pg.Exec(t, `INSERT INTO counter VALUES (1, 0)`)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := pg.Driver.Dialect()

	transient := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: no error", what)
			return
		}
		if !d.IsTransient(err) {
			t.Errorf("%s: %v (%T) is not transient", what, err, err)
		}
	}

	t.Run("ConnectionRefused", func(t *testing.T) {
		u, err := url.Parse(pg.URL)
		if err != nil {
			t.Fatal(err)
		}
		u.Host = closedPort(t)
		u.RawQuery = "connect_timeout=5&sslmode=disable"
		pool, err := pgxpool.New(ctx, u.String())
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		transient("pgx ping on a closed port", pool.Ping(ctx))
		_, err = pgx.Connect(ctx, u.String())
		transient("pgx connect on a closed port", err)
		db, err := sql.Open("pgx", u.String())
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		transient("database/sql ping on a closed port", db.PingContext(ctx))
	})

	t.Run("SerializationFailure", func(t *testing.T) {
		tx, err := pg.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		var n int
		if err := tx.QueryRow(ctx, `SELECT n FROM counter WHERE id = 1`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		pg.Exec(t, `UPDATE counter SET n = n + 1 WHERE id = 1`)
		_, err = tx.Exec(ctx, `UPDATE counter SET n = n + 1 WHERE id = 1`)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "40001" {
			t.Fatalf("err = %v, want a serialization failure (40001)", err)
		}
		transient("serialization failure", err)
	})

	t.Run("LockTimeoutAndStatementTimeout", func(t *testing.T) {
		holder, err := pg.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = holder.Rollback(ctx) }()
		if _, err := holder.Exec(ctx, `UPDATE counter SET n = n + 1 WHERE id = 1`); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct{ what, set, code string }{
			{"lock timeout", `SET LOCAL lock_timeout = '50ms'`, "55P03"},
			{"statement timeout", `SET LOCAL statement_timeout = '50ms'`, "57014"},
		} {
			err := pgx.BeginFunc(ctx, pg.Pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, c.set); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `UPDATE counter SET n = n + 1 WHERE id = 1`)
				return err
			})
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != c.code {
				t.Errorf("%s: err = %v, want SQLSTATE %s", c.what, err, c.code)
			}
			transient(c.what, err)
		}
	})

	t.Run("ReadOnly", func(t *testing.T) {
		// What a standby that was the primary answers to a write.
		err := pgx.BeginTxFunc(ctx, pg.Pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE counter SET n = n + 1 WHERE id = 1`)
			return err
		})
		transient("write in a read-only transaction", err)
	})
}

// TestIsTransientCodes checks the classification of SQLSTATEs that cannot
// be provoked without stopping the shared server.
func TestIsTransientCodes(t *testing.T) {
	for code, want := range map[string]bool{
		"08006": true, "08001": true, "53300": true, "53100": true, "53200": true, "57P01": true, "57P02": true,
		"57P03": true, "40001": true, "40P01": true, "55P03": true, "25006": true, "57014": true,
		"23505": false, "23502": false, "23514": false, "23503": false, "42601": false, "42P01": false,
		"28P01": false, "3D000": false, "22P02": false, "57P04": false,
	} {
		err := &pgconn.PgError{Code: code}
		if got := postgres.IsTransient(err); got != want {
			t.Errorf("IsTransient(SQLSTATE %s) = %v, want %v", code, got, want)
		}
	}
	if postgres.IsTransient(context.Canceled) {
		t.Error("a cancelled context is transient")
	}
}
