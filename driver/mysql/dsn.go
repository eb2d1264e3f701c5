package mysql

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem/internal/tlsfiles"
)

// DSN converts a URL, mysql://user:pass@host:port/db?params, to a DSN for
// github.com/go-sql-driver/mysql: see ParseURL. The TLS configuration of
// sslmode, sslrootcert, sslcert and sslkey is registered with
// mysql.RegisterTLSConfig under a name derived from them (idem-<hash>),
// which the DSN's tls parameter gives.
func DSN(rawURL string) (string, error) {
	cfg, err := ParseURL(rawURL)
	if err != nil {
		return "", err
	}
	if cfg.TLS != nil && cfg.TLSConfig == "" {
		u, _ := url.Parse(rawURL) // ParseURL parsed it
		q := u.Query()
		h := sha256.New()
		for _, k := range tlsParams {
			_, _ = fmt.Fprintf(h, "%s=%s\x00", k, q.Get(k))
		}
		_, _ = fmt.Fprintf(h, "host=%s", cfg.TLS.ServerName)
		cfg.TLSConfig = "idem-" + hex.EncodeToString(h.Sum(nil)[:8])
		if err := gomysql.RegisterTLSConfig(cfg.TLSConfig, cfg.TLS); err != nil {
			return "", fmt.Errorf("idem: mysql: URL: %w", err)
		}
	}
	return cfg.FormatDSN(), nil
}

// tlsParams are the URL parameters of TLS that ParseURL reads, named as
// libpq's.
var tlsParams = []string{"sslmode", "sslrootcert", "sslcert", "sslkey"}

// ParseURL parses a URL, mysql://user:pass@host:port/db?params (or
// mariadb://), into the configuration of github.com/go-sql-driver/mysql.
// The parameters are the driver's, and these of idem for TLS, named as
// PostgreSQL's (libpq's) so that every database URL says TLS the same way:
//
//   - sslmode=disable: no TLS; require: TLS, without checking the server's
//     certificate (but with sslrootcert, as verify-ca); verify-ca: TLS, the
//     server's certificate signed by a trusted authority; verify-full: that,
//     and issued for the URL's host. prefer and allow, which fall back to
//     plain text, are refused.
//   - sslrootcert=FILE: the certificates (PEM) of the authorities to trust,
//     instead of the system's roots.
//   - sslcert=FILE and sslkey=FILE: a client certificate and its key (PEM),
//     for a user created with REQUIRE X509.
//
// sslrootcert, sslcert or sslkey without sslmode means verify-full. The
// files are read now. The driver's own tls parameter (true, skip-verify,
// preferred, or a name given to mysql.RegisterTLSConfig) still works, but
// not with sslmode.
//
// Unless the URL sets them, ParseURL adds idem's defaults: parseTime=true,
// loc=UTC, time_zone='+00:00' (the session works in UTC, like the DATETIME
// columns), charset=utf8mb4 with collation=utf8mb4_bin, and
// interpolateParams=true (one round trip per statement). The collation is
// the one of idem's tables, and the one comparisons of a literal with a
// parameter use: without it they take the server's default for utf8mb4,
// utf8mb4_general_ci (PAD SPACE) on MariaDB and utf8mb4_0900_ai_ci (NO PAD)
// on MySQL 8, and compare otherwise. The port defaults to 3306. Errors never contain the
// password.
func ParseURL(rawURL string) (*gomysql.Config, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL and its password
		}
		return nil, fmt.Errorf("idem: mysql: URL: %w", err)
	}
	if s := strings.ToLower(u.Scheme); s != "mysql" && s != "mariadb" {
		return nil, fmt.Errorf("idem: mysql: URL scheme %q: want mysql://user:pass@host:port/db", u.Scheme)
	}
	host := u.Host
	if host == "" {
		host = "127.0.0.1"
	}
	if u.Port() == "" {
		host = net.JoinHostPort(strings.Trim(host, "[]"), "3306")
	}
	q := u.Query()
	tlsCfg, err := urlTLS(q, cmp.Or(u.Hostname(), "127.0.0.1"))
	if err != nil {
		return nil, fmt.Errorf("idem: mysql: URL: %w", err)
	}
	for _, k := range tlsParams {
		q.Del(k)
	}
	defaults := map[string]string{
		"parseTime":         "true",
		"loc":               "UTC",
		"time_zone":         "'+00:00'",
		"charset":           "utf8mb4",
		"collation":         "utf8mb4_bin",
		"interpolateParams": "true",
	}
	for k, v := range defaults {
		if !q.Has(k) {
			q.Set(k, v)
		}
	}
	cfg, err := gomysql.ParseDSN("tcp(" + host + ")/?" + q.Encode())
	if err != nil {
		return nil, fmt.Errorf("idem: mysql: URL parameters: %w", err)
	}
	cfg.Net = "tcp"
	cfg.Addr = host
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.TLS = tlsCfg
	return cfg, nil
}

// urlTLS returns the TLS configuration of the parameters sslmode,
// sslrootcert, sslcert and sslkey (see ParseURL) for a server reached as
// host; nil without TLS.
func urlTLS(q url.Values, host string) (*tls.Config, error) {
	files := tlsfiles.Files{CA: q.Get("sslrootcert"), Cert: q.Get("sslcert"), Key: q.Get("sslkey"),
		CAParam: "sslrootcert", CertParam: "sslcert", KeyParam: "sslkey"}
	mode := q.Get("sslmode")
	if mode == "" && files.Empty() {
		return nil, nil
	}
	if q.Has("tls") {
		return nil, fmt.Errorf("tls=%s and the ssl parameters: give one or the other (sslmode=verify-full&sslrootcert=ca.pem, say)", q.Get("tls"))
	}
	switch mode {
	case "", "verify-full", "verify-ca", "require":
	case "disable":
		if !files.Empty() {
			return nil, errors.New("sslmode=disable with sslrootcert, sslcert or sslkey: remove them, or ask for TLS (sslmode=verify-full)")
		}
		return nil, nil
	default:
		return nil, fmt.Errorf("sslmode=%q: want disable, require, verify-ca or verify-full (prefer and allow, which may fall back to plain text, are not supported on MySQL)", mode)
	}
	cfg, err := files.Config()
	if err != nil {
		return nil, err
	}
	switch {
	case mode == "" || mode == "verify-full":
		cfg.ServerName = host
	case mode == "verify-ca" || files.CA != "":
		tlsfiles.VerifyChainOnly(cfg)
	default: // require without sslrootcert: encrypted, not authenticated
		cfg.InsecureSkipVerify = true
	}
	return cfg, nil
}

// Open opens a database/sql handle on a mysql:// URL (see ParseURL) or on
// a DSN of github.com/go-sql-driver/mysql, which is used as it is.
func Open(urlOrDSN string) (*sql.DB, error) {
	if !strings.Contains(urlOrDSN, "://") {
		db, err := sql.Open("mysql", urlOrDSN)
		if err != nil {
			return nil, err
		}
		return pooled(db), nil
	}
	cfg, err := ParseURL(urlOrDSN)
	if err != nil {
		return nil, err
	}
	return OpenConfig(cfg)
}

// OpenConfig opens a database/sql handle on a configuration of
// github.com/go-sql-driver/mysql, such as ParseURL's, its TLS field
// included.
func OpenConfig(cfg *gomysql.Config) (*sql.DB, error) {
	conn, err := gomysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("idem: mysql: %w", err)
	}
	return pooled(sql.OpenDB(conn)), nil
}

// pooled sets idem's pool settings on db.
func pooled(db *sql.DB) *sql.DB {
	// Connections are closed before the server's wait_timeout (8 hours by
	// default) closes them under the pool.
	db.SetConnMaxLifetime(time.Hour)
	return db
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
