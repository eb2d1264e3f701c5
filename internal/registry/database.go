package registry

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/driver/sqlite"
	"github.com/idem-go/idem/internal/redact"
)

// Dialect names of Database.Dialect.
const (
	Postgres = "postgres"
	MySQL    = "mysql"
	SQLite   = "sqlite"
)

// databaseOpener opens a database of one scheme.
type databaseOpener func(ctx context.Context, raw string, u *url.URL, o DatabaseOptions) (*Database, error)

// dialect is what a dialect provides to the registry.
type dialect struct {
	// name is Database.Dialect.
	name string
	// schemes are the URL schemes it answers to.
	schemes []string
	// help describes its URLs, for --help texts (DatabaseURLHelp).
	help string
	// open opens a database.
	open databaseOpener
	// sql builds the dialect without a database.
	sql func(idem.Tables) (driver.Dialect, error)
}

// dialects are the database dialects, in the order --help lists them:
// adding a dialect adds its opener and a line here.
var dialects = []dialect{
	{Postgres, []string{"postgres", "postgresql"},
		"postgres://user:pass@host:5432/db?sslmode=verify-full&sslrootcert=ca.pem (sslcert=, sslkey=; every libpq parameter pgx reads)",
		openPostgres, func(t idem.Tables) (driver.Dialect, error) { return postgres.NewDialect(t) }},
	{MySQL, []string{"mysql", "mariadb"},
		"mysql://user:pass@host:3306/db?sslmode=verify-full&sslrootcert=ca.pem (or mariadb://; sslcert=, sslkey=: a client certificate)",
		openMySQL, func(t idem.Tables) (driver.Dialect, error) { return mysql.NewDialect(t) }},
	{SQLite, []string{"sqlite", "file"},
		"sqlite:FILE (sqlite:DIR with a database name: DIR/<name>.db)",
		openSQLite, func(t idem.Tables) (driver.Dialect, error) { return sqlite.NewDialect(t) }},
}

// databaseSchemes maps each database URL scheme to its dialect.
var databaseSchemes = func() map[string]dialect {
	m := map[string]dialect{}
	for _, d := range dialects {
		for _, s := range d.schemes {
			m[s] = d
		}
	}
	return m
}()

// DialectNames returns the dialect names NewDialect accepts, one per
// dialect (it also takes the other URL schemes: postgresql, mariadb).
func DialectNames() []string {
	out := make([]string, len(dialects))
	for i, d := range dialects {
		out[i] = d.name
	}
	return out
}

// NewDialect returns the dialect called name bound to tables, without a
// database: for what needs only the SQL, such as printing the migrations.
func NewDialect(name string, tables idem.Tables) (driver.Dialect, error) {
	d, ok := databaseSchemes[strings.ToLower(name)]
	if !ok {
		return nil, fmt.Errorf("dialect %q: want %s", name, strings.Join(DialectNames(), ", "))
	}
	return d.sql(tables)
}

// DatabaseURLHelp describes the database URLs, one dialect per line, for
// --help texts.
func DatabaseURLHelp() string {
	lines := make([]string, len(dialects))
	for i, d := range dialects {
		lines[i] = d.help
	}
	return strings.Join(lines, ",\n")
}

// DatabaseOptions say how to open a database.
type DatabaseOptions struct {
	// Name isolates the database on a shared server: the PostgreSQL schema
	// (created if missing, and put first on the search_path), the MySQL
	// database (created if missing; the URL's own database is not used), or
	// the SQLite file <Name>.db in the directory the sqlite: URL names.
	// Empty uses what the URL names: its database, or the SQLite file. A
	// plain lower-case identifier.
	Name string
	// Tables names idem's tables. Tables.Schema defaults to Name on MySQL;
	// on PostgreSQL the search_path finds them in Name.
	Tables idem.Tables
	// MaxConns is the connection pool size; 0 keeps the driver's default.
	MaxConns int
}

// Database is an open database with the drivers idem's commands use.
type Database struct {
	// URL is the URL it was opened with (may hold a password: log Redacted).
	URL string
	// Dialect is Postgres, MySQL or SQLite.
	Dialect string
	// Name is DatabaseOptions.Name.
	Name string
	// File is the SQLite database file (empty for the other dialects).
	File string
	// DB is the database/sql handle.
	DB *sql.DB
	// SQL is the idem driver on DB, for every dialect.
	SQL *driver.SQLDriver
	// Pgx is the pgx driver, for PostgreSQL (nil otherwise).
	Pgx *postgres.PgxDriver

	close func()
	// relayPool is the pool of the PostgreSQL relays NewRelay returns.
	relayPool *pgxpool.Pool
}

// Redacted returns the URL without its password.
func (db *Database) Redacted() string { return broker.RedactURL(db.URL) }

// Close closes every handle.
func (db *Database) Close() { db.close() }

var nameRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// DatabaseSchemes returns the supported database URL schemes, sorted.
func DatabaseSchemes() []string {
	out := make([]string, 0, len(databaseSchemes))
	for s := range databaseSchemes {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// OpenDatabase opens the database at rawURL and checks that it answers.
// Its errors never hold the URL's password.
func OpenDatabase(ctx context.Context, rawURL string, o DatabaseOptions) (*Database, error) {
	if rawURL == "" {
		return nil, errors.New("no database URL: pass --db, --db-file FILE or set IDEM_DB_URL (for example postgres://app@localhost:5432/app; a URL with a password in the variable or the file)")
	}
	if o.Name != "" && !nameRE.MatchString(o.Name) {
		return nil, fmt.Errorf("database name %q is not a plain lower-case identifier", o.Name)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL and its password
		}
		return nil, fmt.Errorf("database URL %s: %w", broker.RedactURL(rawURL), err)
	}
	scheme, ok := databaseSchemes[strings.ToLower(u.Scheme)]
	if !ok {
		if u.Scheme == "" {
			return nil, fmt.Errorf("database URL %q has no scheme: want one of %s", broker.RedactURL(rawURL), strings.Join(DatabaseSchemes(), ", "))
		}
		return nil, fmt.Errorf("database URL %s: scheme %q is not supported: want one of %s", broker.RedactURL(rawURL), u.Scheme, strings.Join(DatabaseSchemes(), ", "))
	}
	db, err := scheme.open(ctx, rawURL, u, o)
	// A driver's error may quote the URL or the password: redacted.
	return db, redact.Error(err)
}

// openPostgres opens a PostgreSQL database, its tables in the schema
// o.Name when set.
func openPostgres(ctx context.Context, raw string, _ *url.URL, o DatabaseOptions) (*Database, error) {
	pgxDrv, err := postgres.OpenURL(ctx, raw, postgres.URLOptions{Schema: o.Name, Tables: o.Tables, MaxConns: o.MaxConns})
	if err != nil {
		return nil, fmt.Errorf("database %s: %w", broker.RedactURL(raw), err)
	}
	pool := pgxDrv.Pgx()
	db := stdlib.OpenDBFromPool(pool)
	return &Database{
		URL: raw, Dialect: Postgres, Name: o.Name, DB: db, SQL: driver.NewSQL(db, pgxDrv.Dialect()), Pgx: pgxDrv,
		close: func() { _ = db.Close(); pool.Close() },
	}, nil
}

// openMySQL opens a MySQL or MariaDB database: the database o.Name when
// set, created if missing, instead of the URL's.
func openMySQL(ctx context.Context, raw string, u *url.URL, o DatabaseOptions) (*Database, error) {
	target := raw
	if o.Name != "" {
		own := *u
		own.Path = "/" + o.Name
		target = own.String()
	}
	drv, err := mysql.OpenURL(ctx, raw, mysql.URLOptions{Database: o.Name, Tables: o.Tables, MaxConns: o.MaxConns})
	if err != nil {
		return nil, fmt.Errorf("database %s: %w", broker.RedactURL(target), err)
	}
	db := drv.DB()
	return &Database{URL: target, Dialect: MySQL, Name: o.Name, DB: db, SQL: drv, close: func() { _ = db.Close() }}, nil
}

// SQLitePath returns the path of a sqlite: or file: URL (sqlite.Path).
func SQLitePath(rawURL string) string { return sqlite.Path(rawURL) }

// openSQLite opens sqlite:PATH: the file PATH, or, with a database name,
// the file <name>.db in the directory PATH (created if missing).
func openSQLite(ctx context.Context, raw string, _ *url.URL, o DatabaseOptions) (*Database, error) {
	path := sqlite.Path(raw)
	if path == "" || path == "file:" {
		return nil, fmt.Errorf("database URL %s: want sqlite:FILE (or sqlite:DIR with a database name)", raw)
	}
	file := path
	if o.Name != "" {
		if strings.Contains(path, "?") {
			return nil, fmt.Errorf("database URL %s: with a database name, sqlite:DIR names the directory of <name>.db files, without parameters", raw)
		}
		if err := os.MkdirAll(path, 0o750); err != nil {
			return nil, err
		}
		file = filepath.Join(path, o.Name+".db")
	} else if fi, err := os.Stat(strings.TrimPrefix(path, "file:")); err == nil && fi.IsDir() {
		return nil, fmt.Errorf("database URL %s names a directory: give the database file, for example sqlite:%s", raw, filepath.Join(path, "shop_order.db"))
	}
	fileURL := raw
	if o.Name != "" {
		fileURL = "sqlite:" + file
	}
	drv, err := sqlite.OpenURL(ctx, fileURL, sqlite.URLOptions{Tables: o.Tables, MaxConns: o.MaxConns})
	if err != nil {
		return nil, err
	}
	db := drv.DB()
	return &Database{URL: raw, Dialect: SQLite, Name: o.Name, File: file, DB: db, SQL: drv, close: func() { _ = db.Close() }}, nil
}
