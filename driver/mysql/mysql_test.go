package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	gomysql "github.com/go-sql-driver/mysql"
	"go.uber.org/goleak"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/drivertest"
	"github.com/idem-go/idem/driver/internal/sqltime"
	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/internal/testdb"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestConformance(t *testing.T) {
	drivertest.Run(t, func(t *testing.T, o drivertest.Options) *drivertest.DB[*sql.Tx] {
		db := testdb.NewMariaDB(t, testdb.Options{NoMigrate: o.NoMigrate})
		return &drivertest.DB[*sql.Tx]{
			Driver:            db.Driver,
			Schema:            db.Name,
			IsUniqueViolation: mysql.IsDuplicateKey,
			Session: func(ctx context.Context, ex driver.Executor) (int64, error) {
				var id int64
				err := driver.QueryRow(ctx, ex, "SELECT CONNECTION_ID()", nil, &id)
				return id, err
			},
			// Each test has its own database: a lock wait in it, or a marker
			// insert still running on another session while the first worker
			// holds its transaction open, is the second worker waiting for the
			// first. (MariaDB does not always list a transaction blocked on a
			// duplicate-key check in INNODB_TRX, so both are looked at.)
			Blocking: func(ctx context.Context, first int64) (bool, error) {
				n, err := mysql.LockWaits(ctx, db.DB, db.Name)
				if err != nil || n > 0 {
					return n > 0, err
				}
				var inserting int
				err = db.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.PROCESSLIST
WHERE DB = ? AND ID <> ? AND ID <> CONNECTION_ID() AND INFO LIKE 'INSERT INTO %processed_event%'`, db.Name, first).Scan(&inserting)
				return inserting > 0, err
			},
			Features: drivertest.Features{TimeArg: sqltime.Arg},
		}
	})
}

func TestIsDuplicateKey(t *testing.T) {
	mariadb := &gomysql.MySQLError{Number: 1062, Message: "Duplicate entry 'stock-0193' for key 'PRIMARY'"}
	mysql8 := &gomysql.MySQLError{Number: 1062, Message: "Duplicate entry 'stock-0193' for key 'processed_event.PRIMARY'"}
	other := &gomysql.MySQLError{Number: 1062, Message: "Duplicate entry '42-p' for key 'reservation_order_product'"}
	tricky := &gomysql.MySQLError{Number: 1062, Message: "Duplicate entry 'for key 'PRIMARY'' for key 'reservation.uniq'"}
	notDup := &gomysql.MySQLError{Number: 1452, Message: "Cannot add or update a child row"}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"MariaDB primary", mariadb, true},
		{"MySQL 8 primary", mysql8, true},
		{"wrapped", errors.Join(errors.New("context"), mariadb), true},
		{"other key", other, false},
		{"key name in the value", tricky, false},
		{"other error", notDup, false},
		{"nil", nil, false},
	} {
		if got := mysql.IsDuplicateKey(c.err, "processed_event", "PRIMARY"); got != c.want {
			t.Errorf("%s: IsDuplicateKey = %v, want %v", c.name, got, c.want)
		}
	}
	if mysql.IsDuplicateKey(mysql8, "other_table", "PRIMARY") {
		t.Error("MySQL 8 message of processed_event matched other_table")
	}
	if !mysql.IsDuplicateKey(other, "", "") {
		t.Error("any key: want true")
	}
}

func TestDSN(t *testing.T) {
	dsn, err := mysql.DSN("mysql://idem:p%40ss@db.example:3307/shop?timeout=5s")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("parse %s: %v", dsn, err)
	}
	if cfg.User != "idem" || cfg.Passwd != "p@ss" || cfg.Addr != "db.example:3307" || cfg.DBName != "shop" ||
		!cfg.ParseTime || cfg.Loc.String() != "UTC" || cfg.Params["time_zone"] != "'+00:00'" || cfg.Timeout.String() != "5s" ||
		cfg.Collation != "utf8mb4_bin" {
		t.Errorf("config = %+v", cfg)
	}
	dsn, err = mysql.DSN("mysql://u@localhost/db?parseTime=false")
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ = gomysql.ParseDSN(dsn)
	if cfg.ParseTime || cfg.Addr != "localhost:3306" {
		t.Errorf("URL settings not kept: %+v", cfg)
	}
	if _, err := mysql.DSN("postgres://x@y/z"); err == nil {
		t.Error("postgres URL accepted")
	}
}
