package mysql_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/internal/testdb"
)

// TestIsTransientRealErrors provokes, on the test server and on a closed
// port, the errors IsTransient must recognise.
func TestIsTransientRealErrors(t *testing.T) {
	t.Parallel()
	db := testdb.NewMariaDB(t)
	db.Exec(t, `CREATE TABLE counter (id INT PRIMARY KEY, n INT NOT NULL) ENGINE=InnoDB`)
	db.Exec(t, `INSERT INTO counter VALUES (1, 0)`)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := db.Driver.Dialect()
	errNumber := func(err error) uint16 {
		var myErr *gomysql.MySQLError
		if errors.As(err, &myErr) {
			return myErr.Number
		}
		return 0
	}
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
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		_ = l.Close()
		u, err := url.Parse(db.URL)
		if err != nil {
			t.Fatal(err)
		}
		u.Host = addr
		closed, err := mysql.Open(u.String())
		if err != nil {
			t.Fatal(err)
		}
		defer closed.Close()
		transient("ping on a closed port", closed.PingContext(ctx))
	})

	t.Run("SnapshotConflictAndLockWaitTimeout", func(t *testing.T) {
		// MariaDB 10.6.18 and later report a row changed since the
		// transaction's snapshot under innodb_snapshot_isolation (error
		// 1020), where MySQL and older MariaDB go on silently.
		conn, err := db.DB.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.ExecContext(ctx, `SET SESSION innodb_snapshot_isolation = ON, SESSION innodb_lock_wait_timeout = 1`); err != nil {
			t.Fatalf("set snapshot isolation (MariaDB 10.6.18 or later): %v", err)
		}
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback() }()
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT n FROM counter WHERE id = 1`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		db.Exec(t, `UPDATE counter SET n = n + 1 WHERE id = 1`)
		_, err = tx.ExecContext(ctx, `UPDATE counter SET n = n + 1 WHERE id = 1`)
		if errNumber(err) != 1020 {
			t.Fatalf("err = %v, want error 1020 (record changed since last read)", err)
		}
		transient("snapshot conflict", err)
		_ = tx.Rollback()

		// Lock wait timeout (innodb_lock_wait_timeout = 1 on conn).
		holder, err := db.DB.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = holder.Rollback() }()
		if _, err := holder.ExecContext(ctx, `UPDATE counter SET n = n + 1 WHERE id = 1`); err != nil {
			t.Fatal(err)
		}
		_, err = conn.ExecContext(ctx, `UPDATE counter SET n = n + 1 WHERE id = 1`)
		if errNumber(err) != 1205 {
			t.Fatalf("err = %v, want error 1205 (lock wait timeout)", err)
		}
		transient("lock wait timeout", err)
	})
}

// TestIsTransientNumbers checks the classification of error numbers that
// cannot be provoked without stopping or reconfiguring the shared server.
func TestIsTransientNumbers(t *testing.T) {
	for number, want := range map[uint16]bool{
		1040: true, 1053: true, 1205: true, 1213: true, 1290: true, 1836: true, 1927: true, 1020: true, 1021: true,
		1062: false, 1064: false, 1048: false, 4025: false, 1146: false, 1452: false, 1792: false,
	} {
		err := &gomysql.MySQLError{Number: number}
		if got := mysql.IsTransient(err); got != want {
			t.Errorf("IsTransient(error %d) = %v, want %v", number, got, want)
		}
	}
	if !mysql.IsTransient(gomysql.ErrInvalidConn) {
		t.Error("ErrInvalidConn is not transient")
	}
	if mysql.IsTransient(context.Canceled) {
		t.Error("a cancelled context is transient")
	}
}
