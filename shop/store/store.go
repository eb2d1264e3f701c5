// Package store opens the database of one shop service and applies its
// migrations. It is the one place that knows the SQL dialects: how a
// service's tables are isolated (a PostgreSQL schema, a MariaDB database, a
// SQLite file), placeholders (Q), and which statements each dialect
// writes its own way (Pick).
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/driver/sqlite"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/migrate"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
	"github.com/idem-go/idem/relay/binlog"
	"github.com/idem-go/idem/relay/cdc"
	"github.com/idem-go/idem/relay/logrelay"
)

// Dialect names, as the drivers' Dialect().Name() gives them.
const (
	Postgres = "postgres"
	MySQL    = "mysql"
	SQLite   = "sqlite"
)

// MaxConnsDefault is the connection pool size of a service's database.
const MaxConnsDefault = 16

// DB is the database of one service.
type DB struct {
	// Service is the service owning the database ("order", "stock"...).
	Service string
	// Dialect is Postgres, MySQL or SQLite.
	Dialect string
	// Schema is the PostgreSQL schema or MariaDB database holding the
	// service's tables (empty for SQLite).
	Schema string
	// File is the SQLite database file (empty for the other dialects).
	File string
	// SQL is the database/sql handle the service's code uses.
	SQL *sql.DB
	// Driver is the idem driver on SQL, for the outbox writer and the
	// consumers.
	Driver *driver.SQLDriver

	// url is the URL of the service's database; pgx is the pgx driver of
	// a PostgreSQL database (nil otherwise), which the relay prefers for
	// its LISTEN/NOTIFY; close closes the handles. Unset in tests that
	// build a DB by hand.
	url       string
	pgx       *postgres.PgxDriver
	close     func()
	observer  func(consumer string) inbox.Observer
	outboxLog bool
	notify    atomic.Pointer[func()]
	// added counts the InsertOutbox calls of OutboxWriter's writers
	// (OutboxAdds).
	added atomic.Uint64
	// notVisible counts the calls of NotVisible.
	notVisible atomic.Uint64
}

// Options adjust Open.
type Options struct {
	// MaxConns is the connection pool size. Defaults to MaxConnsDefault.
	MaxConns int
	// Observer, when set, gives the observer (metrics) of each consumer
	// that NewConsumer creates, by consumer name.
	Observer func(consumer string) inbox.Observer
	// OutboxLog has OutboxWriter write events as WAL messages
	// (outbox.NewLogWriter) instead of outbox rows: PostgreSQL only, and
	// only a CDC relay (NewCDCRelay) publishes them.
	OutboxLog bool
}

// Open opens the database of service at rawURL, its tables isolated by
// schema (a plain lower-case identifier such as "shop_order"):
//
//   - postgres://...: the tables live in the PostgreSQL schema named schema,
//     created if missing, and found through the connection's search_path.
//   - mysql://... (or mariadb://...): the tables live in the database named
//     schema, created if missing; the URL's own database is not used.
//   - sqlite:DIR (or sqlite:///abs/dir): the tables live in the file
//     DIR/<schema>.db, created with DIR if missing.
func Open(ctx context.Context, service, rawURL, schema string, opts Options) (*DB, error) {
	if opts.MaxConns == 0 {
		opts.MaxConns = MaxConnsDefault
	}
	if schema == "" {
		return nil, fmt.Errorf("%s: no schema name", service)
	}
	if !validSchema(schema) {
		return nil, fmt.Errorf("%s: schema name %q: want a plain lower-case identifier", service, schema)
	}
	db := &DB{Service: service, observer: opts.Observer, outboxLog: opts.OutboxLog}
	if err := db.open(ctx, rawURL, schema, opts.MaxConns); err != nil {
		return nil, fmt.Errorf("%s: %w", service, err)
	}
	if opts.OutboxLog && db.Dialect != Postgres {
		db.Close()
		return nil, fmt.Errorf("%s: events as WAL messages need PostgreSQL (pg_logical_emit_message), and this database is %s: keep the outbox table", service, db.Dialect)
	}
	return db, nil
}

// validSchema reports whether name is a plain lower-case identifier.
func validSchema(name string) bool {
	if len(name) > 63 || name[0] >= '0' && name[0] <= '9' {
		return false
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// open opens the database at rawURL, the service's tables in schema, with
// the public openers of idem's drivers.
func (db *DB) open(ctx context.Context, rawURL, schema string, maxConns int) error {
	if rawURL == "" {
		return errors.New("no database URL (for example postgres://user:pass@localhost:5432/shop, mysql://user:pass@localhost:3306/shop or sqlite:data)")
	}
	scheme, _, _ := strings.Cut(rawURL, ":")
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		// The pgx driver for the relay, database/sql on the same pool for
		// the rest.
		pgx, err := postgres.OpenURL(ctx, rawURL, postgres.URLOptions{Schema: schema, MaxConns: maxConns})
		if err != nil {
			return fmt.Errorf("database %s: %w", broker.RedactURL(rawURL), err)
		}
		pool := pgx.Pgx()
		sqlDB := stdlib.OpenDBFromPool(pool)
		drv := driver.NewSQL(sqlDB, pgx.Dialect())
		db.Dialect, db.Schema, db.url, db.pgx = Postgres, schema, rawURL, pgx
		db.SQL, db.Driver, db.close = sqlDB, drv, func() { _ = sqlDB.Close(); pool.Close() }
	case "mysql", "mariadb":
		// The service's own database on the server, named schema.
		u, err := url.Parse(rawURL)
		if err != nil {
			return fmt.Errorf("database URL %s: not a URL", broker.RedactURL(rawURL))
		}
		u.Path = "/" + schema
		drv, err := mysql.OpenURL(ctx, rawURL, mysql.URLOptions{Database: schema, MaxConns: maxConns})
		if err != nil {
			return fmt.Errorf("database %s: %w", broker.RedactURL(u.String()), err)
		}
		db.Dialect, db.Schema, db.url = MySQL, schema, u.String()
		db.SQL, db.Driver, db.close = drv.DB(), drv, func() { _ = drv.DB().Close() }
	case "sqlite":
		// sqlite:DIR holds a file per service: DIR/<schema>.db.
		dir := sqlite.Path(rawURL)
		if dir == "" || strings.Contains(dir, "?") {
			return fmt.Errorf("database URL %s: want sqlite:DIR, the directory of the services' <schema>.db files, without parameters", rawURL)
		}
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
		file := filepath.Join(dir, schema+".db")
		drv, err := sqlite.OpenURL(ctx, "sqlite:"+file, sqlite.URLOptions{MaxConns: maxConns})
		if err != nil {
			return err
		}
		db.Dialect, db.File, db.url = SQLite, file, rawURL
		db.SQL, db.Driver, db.close = drv.DB(), drv, func() { _ = drv.DB().Close() }
	default:
		return fmt.Errorf("database URL %s: want postgres://, mysql:// (or mariadb://) or sqlite:DIR", broker.RedactURL(rawURL))
	}
	return nil
}

// Redacted returns the database URL without its password.
func (db *DB) Redacted() string { return broker.RedactURL(db.url) }

// Where says where the service's tables are, for the start-up banner.
func (db *DB) Where() string {
	switch {
	case db.File != "":
		return db.File
	case db.Dialect == MySQL:
		return db.Redacted()
	case db.Schema != "":
		return db.Redacted() + " (schema " + db.Schema + ")"
	}
	return db.Redacted()
}

// Close closes the database.
func (db *DB) Close() {
	if db.close != nil {
		db.close()
	}
}

// Q returns query, written with PostgreSQL's placeholders $1, $2..., for
// the database's dialect. PostgreSQL and SQLite take it as it is
// (modernc.org/sqlite binds $N to the N-th argument). MySQL and MariaDB
// number no placeholders: each ? takes the next argument, so there $1,
// $2... become ?, and must appear once each, in order (Q panics otherwise:
// write such a query per dialect). Statements that differ otherwise are
// written per dialect (Pick).
func (db *DB) Q(query string) string {
	if db.Dialect != MySQL {
		return query
	}
	return questionMarks(query)
}

// questionMarks returns query with $1, $2... (outside quotes) replaced by ?.
func questionMarks(query string) string {
	var b strings.Builder
	b.Grow(len(query))
	next, quoted := 1, false
	for i := 0; i < len(query); i++ {
		c := query[i]
		if c == '\'' {
			quoted = !quoted
		}
		if c != '$' || quoted || i+1 == len(query) || query[i+1] < '0' || query[i+1] > '9' {
			b.WriteByte(c)
			continue
		}
		j := i + 1
		for j < len(query) && query[j] >= '0' && query[j] <= '9' {
			j++
		}
		if n, _ := strconv.Atoi(query[i+1 : j]); n != next {
			panic(fmt.Sprintf("store: placeholder $%d where $%d is due: MySQL takes the arguments in order, one ? each: %s", n, next, query))
		}
		b.WriteByte('?')
		next++
		i = j - 1
	}
	return b.String()
}

// Pick returns the statement of the database's dialect from byDialect,
// keyed by Postgres, MySQL and SQLite, or the PostgreSQL one when the
// dialect has none, through Q: for the statements a dialect writes its own
// way, such as an insert that skips duplicates (ON CONFLICT DO NOTHING, ON
// DUPLICATE KEY UPDATE) or a row lock (FOR UPDATE; SQLite locks the whole
// database when a transaction begins).
func (db *DB) Pick(byDialect map[string]string) string {
	if q, ok := byDialect[db.Dialect]; ok {
		return db.Q(q)
	}
	return db.Q(byDialect[Postgres])
}

// NewConsumer returns an idempotent consumer on the service's database,
// with the observer that Options.Observer gives for cfg.Name.
func (db *DB) NewConsumer(cfg inbox.Config) (*inbox.Consumer[*sql.Tx], error) {
	if db.observer != nil {
		cfg.Observer = db.observer(cfg.Name)
	}
	return inbox.New(db.Driver, cfg)
}

// Relay is a running outbox relay: the polling relay (NewRelay) or the CDC
// relay (NewCDCRelay). Stats gives the figures of the polling relay's
// relay.Stats that the relay has (the CDC relay's are mapped onto them).
type Relay interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
	Stats() relay.Stats
}

// NewRelay returns a relay publishing the service's outbox through pub. On
// PostgreSQL it uses pgx, whose LISTEN/NOTIFY wakes it on every commit, and
// Notify does nothing. Elsewhere the relay polls; Notify then wakes it, so that it can poll
// rarely when idle (relay.Config.MaxPollInterval) and still publish the
// rows of this process at once.
func (db *DB) NewRelay(pub broker.Publisher, cfg relay.Config) (Relay, error) {
	var (
		r   Relay
		err error
	)
	if db.pgx != nil {
		r, err = relay.New(db.pgx, pub, cfg)
	} else {
		r, err = relay.New(db.Driver, pub, cfg)
	}
	if err != nil {
		return nil, err
	}
	// With pgx the database's notifications wake the relay; a Notify
	// after the same commit would only make it claim a second time.
	if n, ok := r.(interface{ Notify() }); ok && db.pgx == nil {
		notify := n.Notify
		db.notify.Store(&notify)
	}
	return r, nil
}

// Notify tells the relay of the service's outbox, when one runs in this
// process (NewRelay), that outbox rows were just committed, so that it
// claims them now rather than at its next poll. Without a relay in the
// process, or on PostgreSQL (where LISTEN/NOTIFY wakes it), it does
// nothing; a relay in another process finds the rows when it polls, or
// through LISTEN/NOTIFY on PostgreSQL. It never blocks: call
// it after each commit that wrote outbox rows.
func (db *DB) Notify() {
	if f := db.notify.Load(); f != nil {
		(*f)()
	}
}

// OutboxWriter returns the writer of the service's events: outbox rows, or
// with Options.OutboxLog WAL messages in the caller's transaction.
func (db *DB) OutboxWriter() *outbox.Writer[*sql.Tx] {
	if db.outboxLog {
		// Open checked the dialect: NewLogWriter cannot fail on PostgreSQL.
		if w, err := outbox.NewLogWriter(db.Driver, db.CDCPrefix()); err == nil {
			return w
		}
	}
	return outbox.NewWriter[*sql.Tx](countingDriver{db.Driver, &db.added})
}

// OutboxAdds is how many times the writers of OutboxWriter inserted outbox
// rows, committed or not. Compare it before and after a piece of work to
// tell whether the work may have committed rows, and call Notify only then
// (NotifyIfAdded): a Notify after a commit that wrote none makes the relay
// claim for nothing.
func (db *DB) OutboxAdds() uint64 { return db.added.Load() }

// NotifyIfAdded calls Notify when outbox rows were inserted since OutboxAdds
// returned before. Rows inserted by other work meanwhile count too: a
// Notify too many costs one claim, one too few would leave rows waiting for
// the relay's poll.
func (db *DB) NotifyIfAdded(before uint64) {
	if db.added.Load() != before {
		db.Notify()
	}
}

// countingDriver is the driver of OutboxWriter's writers: it counts their
// inserts in added.
type countingDriver struct {
	*driver.SQLDriver
	added *atomic.Uint64
}

func (d countingDriver) Dialect() driver.Dialect {
	return countingDialect{d.SQLDriver.Dialect(), d.added}
}

type countingDialect struct {
	driver.Dialect
	added *atomic.Uint64
}

func (d countingDialect) InsertOutbox(ctx context.Context, ex driver.Executor, rows []driver.OutboxRow) error {
	d.added.Add(1)
	return d.Dialect.InsertOutbox(ctx, ex, rows)
}

// CDCPrefix is the prefix of the service's events written as WAL messages
// (Options.OutboxLog): outbox.LogPrefix of its outbox,
// idem.outbox:<schema>.outbox. Every slot of a database reads every WAL
// message, whatever its publication: with one prefix for all, each
// service's CDC relay would publish the events of the others too.
func (db *DB) CDCPrefix() string { return outbox.LogPrefix(idem.Tables{Schema: db.Schema}) }

// CDCSlot is the logical replication slot (and publication) of the
// service's CDC relay: idem_<schema>_outbox, one per service outbox, so that
// several shops (namespaces) on one server never share one.
func (db *DB) CDCSlot() string { return "idem_" + db.Schema + "_outbox" }

// NewCDCRelay returns a relay that reads the service's outbox from the
// database's log and publishes through pub: on PostgreSQL the logical
// replication stream (package relay/cdc) through the slot CDCSlot, with
// cfg.Tables, cfg.Slot, cfg.Publication and cfg.MessagePrefix (CDCPrefix)
// set here; on MariaDB the binary log (package relay/binlog), with
// cfg.Logger, cfg.Observer, cfg.Window, cfg.BatchSize, cfg.QuarantineAfter
// and the archive's retention and purge interval. SQLite has no log to
// read: the error says to run the polling relay.
func (db *DB) NewCDCRelay(pub broker.Publisher, cfg cdc.Config) (*CDCRelay, error) {
	if db.Dialect == MySQL && db.url != "" {
		r, err := binlog.New(db.url, pub, binlog.Config{Tables: idem.Tables{Schema: db.Schema}, Logger: cfg.Logger,
			Observer: cfg.Observer, Window: cfg.Window, BatchSize: cfg.BatchSize, QuarantineAfter: cfg.QuarantineAfter,
			ArchiveRetention: cfg.ArchiveRetention, ArchivePurgeInterval: cfg.ArchivePurgeInterval})
		if err != nil {
			return nil, err
		}
		return &CDCRelay{Log: r}, nil
	}
	if db.Dialect != Postgres || db.url == "" {
		return nil, fmt.Errorf("%s: a CDC relay reads PostgreSQL's logical replication stream or MariaDB's binary log, and this database is %s: run the polling relay (--relay poll)", db.Service, db.Dialect)
	}
	cfg.Tables = idem.Tables{Schema: db.Schema}
	cfg.Slot = db.CDCSlot()
	cfg.Publication = db.CDCSlot()
	cfg.MessagePrefix = db.CDCPrefix()
	r, err := cdc.New(db.url, pub, cfg)
	if err != nil {
		return nil, err
	}
	return &CDCRelay{Log: r}, nil
}

// DropCDCSlot drops the replication slot and the publication of the
// service's CDC relay, when they exist: a slot nobody reads keeps its WAL
// on the server forever. Call it when retiring the service's database, once
// its relay has stopped (an active slot cannot be dropped).
func (db *DB) DropCDCSlot(ctx context.Context) error {
	if db.Dialect != Postgres || db.url == "" {
		return nil
	}
	var n int
	if err := db.SQL.QueryRowContext(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, db.CDCSlot()).Scan(&n); err != nil {
		return fmt.Errorf("%s: replication slots: %w", db.Service, err)
	}
	if n > 0 {
		if err := cdc.DropSlot(ctx, db.url, db.CDCSlot()); err != nil {
			return fmt.Errorf("%s: drop slot %s: %w", db.Service, db.CDCSlot(), err)
		}
	}
	if _, err := db.SQL.ExecContext(ctx, `DROP PUBLICATION IF EXISTS "`+db.CDCSlot()+`"`); err != nil {
		return fmt.Errorf("%s: drop publication %s: %w", db.Service, db.CDCSlot(), err)
	}
	return nil
}

// CDCRelay is a log relay seen as a Relay: PostgreSQL's (relay/cdc) or
// MariaDB's (relay/binlog).
type CDCRelay struct {
	Log logrelay.Relay
}

// Start starts the relay.
func (r *CDCRelay) Start(ctx context.Context) error { return r.Log.Start(ctx) }

// Stop stops the relay.
func (r *CDCRelay) Stop(ctx context.Context) error { return r.Log.Stop(ctx) }

// Stats maps the CDC relay's figures onto relay.Stats: what it published,
// its failed publish calls, the messages read and not yet confirmed as the
// backlog (and in flight), the oldest of their commits, and what it
// quarantined.
func (r *CDCRelay) Stats() relay.Stats {
	s := r.Log.Stats()
	out := relay.Stats{
		Published:         s.Published,
		PublishErrors:     s.PublishFailures,
		Quarantined:       s.Quarantined,
		QuarantinedRows:   s.Quarantined,
		Deleted:           s.Deleted,
		Backlog:           s.InFlight,
		InFlight:          s.InFlight,
		BacklogMeasuredAt: time.Now(),
	}
	if s.Lag > 0 {
		out.OldestUnpublished = out.BacklogMeasuredAt.Add(-s.Lag)
	}
	return out
}

// Migrations are a service's own schema changes, per dialect: element i is
// version i+1. Each script is a list of statements separated by ";" at the
// end of a line.
type Migrations map[string][]string

// Migrate applies idem's migrations (outbox, processed_event,
// failed_message), then the service's own, recorded in shop_schema_migration,
// then those of the application ledger (applied_event, see
// RecordApplications), recorded in shop_ledger_migration.
// Concurrent runs on the same database are serialised: by an advisory lock
// on PostgreSQL, a named lock on MySQL/MariaDB (whose DDL is not
// transactional: each version is recorded right after its statements), and
// the write lock of an immediate transaction on SQLite.
//
// A database that fails transiently meanwhile (a SQLite file whose write
// lock other processes hold past the busy timeout, a server restarting) is
// tried again every half second, with a warning, for MigrateWait: a process
// started while the database is busy waits rather than exits.
func (db *DB) Migrate(ctx context.Context, own Migrations, log *slog.Logger) error {
	deadline := time.Now().Add(MigrateWait)
	for {
		err := db.migrate(ctx, own, log)
		if err == nil || !db.Driver.Dialect().IsTransient(err) || time.Now().After(deadline) {
			return err
		}
		if log != nil {
			log.Warn("database busy or away during the migrations; trying again", "service", db.Service, "error", err)
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// MigrateWait is how long Migrate tries again after transient failures.
const MigrateWait = 30 * time.Second

func (db *DB) migrate(ctx context.Context, own Migrations, log *slog.Logger) error {
	if _, err := migrate.New(db.Driver).Up(ctx); err != nil {
		return fmt.Errorf("%s: idem migrations: %w", db.Service, err)
	}
	scripts, ok := own[db.Dialect]
	if !ok {
		return fmt.Errorf("%s: no migrations for dialect %s", db.Service, db.Dialect)
	}
	if err := db.migrateScripts(ctx, "shop_schema_migration", scripts, log); err != nil {
		return err
	}
	return db.migrateScripts(ctx, ledgerVersions, ledgerMigrations[db.Dialect], log)
}

// migrateScripts applies the scripts not applied yet, recorded in the
// table versions.
func (db *DB) migrateScripts(ctx context.Context, versions string, scripts []string, log *slog.Logger) error {
	if db.Dialect == MySQL {
		return db.migrateMySQL(ctx, versions, scripts, log)
	}
	tx, err := db.SQL.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if db.Dialect == Postgres {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext(current_schema() || '.' || $1))`, versions); err != nil {
			return err
		}
	}
	if err := db.applyMigrations(ctx, tx, versions, scripts, log); err != nil {
		return err
	}
	return tx.Commit()
}

func (db *DB) migrateMySQL(ctx context.Context, versions string, scripts []string, log *slog.Logger) error {
	conn, err := db.SQL.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	lock := db.Schema + "." + versions
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, 120)`, lock).Scan(&got); err != nil {
		return fmt.Errorf("%s: migration lock: %w", db.Service, err)
	}
	if got.Int64 != 1 {
		return fmt.Errorf("%s: migration lock %s not obtained within 120s", db.Service, lock)
	}
	defer func() { _, _ = conn.ExecContext(context.WithoutCancel(ctx), `SELECT RELEASE_LOCK(?)`, lock) }()
	// MariaDB commits each DDL statement: a version stopped halfway (ctx
	// cancelled by a SIGTERM) would leave tables that the next run cannot
	// create again. Once the lock is held, versions run to their end.
	return db.applyMigrations(context.WithoutCancel(ctx), conn, versions, scripts, log)
}

type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func (db *DB) applyMigrations(ctx context.Context, ex querier, versions string, scripts []string, log *slog.Logger) error {
	if _, err := ex.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+versions+` (version integer PRIMARY KEY, applied_at varchar(40) NOT NULL)`); err != nil {
		return fmt.Errorf("%s: migration table: %w", db.Service, err)
	}
	var current int
	if err := ex.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM `+versions).Scan(&current); err != nil {
		return err
	}
	if current > len(scripts) {
		return fmt.Errorf("%s: database schema version %d (%s) is newer than this shop (%d)", db.Service, current, versions, len(scripts))
	}
	for v := current + 1; v <= len(scripts); v++ {
		for _, stmt := range migrate.SplitStatements(scripts[v-1]) {
			if _, err := ex.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("%s: migration %d: %w\n%s", db.Service, v, err, stmt)
			}
		}
		if _, err := ex.ExecContext(ctx, db.Q(`INSERT INTO `+versions+` (version, applied_at) VALUES ($1, $2)`),
			v, time.Now().UTC().Format(time.RFC3339)); err != nil {
			return err
		}
		if log != nil {
			log.Info("migration applied", "service", db.Service, "version", v, "table", versions)
		}
	}
	return nil
}

// Count runs a SELECT count(*) query and returns its result.
func (db *DB) Count(ctx context.Context, query string, args ...any) (int64, error) {
	var n int64
	err := db.SQL.QueryRowContext(ctx, db.Q(query), args...).Scan(&n)
	return n, err
}

// IsUniqueViolation reports whether err is a unique-key violation.
func (db *DB) IsUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "23505"
	}
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "UNIQUE constraint failed") || strings.Contains(msg, "Duplicate entry")
}

// Itoa is strconv.Itoa, for building identifiers.
func Itoa(n int) string { return strconv.Itoa(n) }
