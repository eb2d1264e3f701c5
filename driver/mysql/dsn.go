package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
)

// DSN converts a URL, mysql://user:pass@host:port/db?params, to a DSN for
// github.com/go-sql-driver/mysql. The parameters are the driver's. Unless
// the URL sets them, DSN adds idem's defaults: parseTime=true, loc=UTC,
// time_zone='+00:00' (the session works in UTC, like the DATETIME columns),
// charset=utf8mb4 and interpolateParams=true (one round trip per statement).
// The port defaults to 3306.
func DSN(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", err
	}
	if s := strings.ToLower(u.Scheme); s != "mysql" && s != "mariadb" {
		return "", fmt.Errorf("idem: mysql: URL scheme %q: want mysql://user:pass@host:port/db", u.Scheme)
	}
	host := u.Host
	if host == "" {
		host = "127.0.0.1"
	}
	if u.Port() == "" {
		host = net.JoinHostPort(strings.Trim(host, "[]"), "3306")
	}
	q := u.Query()
	defaults := map[string]string{
		"parseTime":         "true",
		"loc":               "UTC",
		"time_zone":         "'+00:00'",
		"charset":           "utf8mb4",
		"interpolateParams": "true",
	}
	for k, v := range defaults {
		if !q.Has(k) {
			q.Set(k, v)
		}
	}
	cfg, err := gomysql.ParseDSN("tcp(" + host + ")/?" + q.Encode())
	if err != nil {
		return "", fmt.Errorf("idem: mysql: URL parameters: %w", err)
	}
	cfg.Net = "tcp"
	cfg.Addr = host
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	return cfg.FormatDSN(), nil
}

// Open opens a database/sql handle on a mysql:// URL (see DSN) or on a DSN
// of github.com/go-sql-driver/mysql, which is used as it is.
func Open(urlOrDSN string) (*sql.DB, error) {
	dsn := urlOrDSN
	if strings.Contains(urlOrDSN, "://") {
		var err error
		if dsn, err = DSN(urlOrDSN); err != nil {
			return nil, err
		}
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, err
	}
	// Connections are closed before the server's wait_timeout (8 hours by
	// default) closes them under the pool.
	db.SetConnMaxLifetime(time.Hour)
	return db, nil
}

// LockWaits counts the transactions of connections using the database
// name that wait for a lock. Tests and diagnostics use it; it reads
// information_schema, which needs the PROCESS privilege to see other users'
// connections.
func LockWaits(ctx context.Context, db *sql.DB, name string) (int, error) {
	var n int
	err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.INNODB_TRX t
JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id
WHERE t.trx_state = 'LOCK WAIT' AND p.DB = ?`, name).Scan(&n)
	return n, err
}
