package binlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/internal/mysqlrepl"
	"github.com/idem-go/idem/relay/internal/logengine"
	"github.com/idem-go/idem/relay/internal/sendspan"
	"github.com/idem-go/idem/relay/logrelay"
)

// Relay publishes the inserts into a MariaDB or MySQL 8 outbox table, read
// from the server's binary log, through a broker.Publisher. Make one with
// New; Start and Stop it like the other relays (logrelay.Relay).
//
// Start checks the server (binary log on, in row format with full rows,
// the privileges, the outbox and position tables) and takes the outbox's
// lock when it is free; a second relay on the outbox waits and takes over
// when the first stops. Stop stores the position of what was published;
// messages abandoned at the end of Stop's context are published again from
// the stored position. In Stats, Position is the GTID position last
// stored (MariaDB's, or MySQL's GTID set), File and FilePos where the
// relay read last, LagBytes the binlog written after that.
//
// Delayed rows (idem.Event.NotBefore, a not_before column from migration
// 0012) are held: the stream skips their inserts and the stored position
// moves on; the rows wait in the table, where the relay that holds the
// outbox looks every Config.DueInterval for those due by Config.Now,
// publishes them, then deletes them (with KeepRows, sets their
// published_at). A crash before the delete leaves the row in the table for
// the next relay, and the first start's snapshot leaves delayed rows to the
// same scan. A delayed row holds back nothing of its aggregate.
type Relay struct {
	// Relay is the engine all log relays share.
	logrelay.Relay
	src *source
}

// source is what the engine (relay/internal/logengine) reads: the binlog,
// and the outbox's SQL.
type source struct {
	cfg Config
	log *slog.Logger
	eng *logengine.Relay

	db   *sql.DB
	drv  *driver.SQLDriver // idem's dialect on db, set at Setup
	repl mysqlrepl.Config

	schema string // the outbox's database, resolved at Start
	sql    queries
	// idemTable is true when the outbox has idem's seq, published_at and
	// quarantined_at columns.
	idemTable bool
	// delayTable is true when it also has not_before (migration 0012):
	// delayed rows wait in it.
	delayTable bool

	// lock holds the outbox's named lock while this relay holds it: taken
	// by Setup when free, or by Lead; used by the engine's reading
	// goroutine only.
	lock *sql.Conn

	// names says where the relay reads the outbox's column names
	// (namesFromBinlog, namesFromSchema), logged when it changes.
	names atomic.Int32
	// set is what Setup found.
	set logengine.Setup
	// mysql is set by Setup when the server is MySQL rather than MariaDB:
	// positions are GTID sets (mysql.go).
	mysql bool
	// resnapshot asks the next session to start from a snapshot of the
	// table, as at a first start: the rows at the stored position were
	// logged under columns the relay cannot name (ErrColumnsChanged).
	// Read and written by the reading goroutine only.
	resnapshot bool
}

// New returns a Relay reading the outbox of cfg.Tables in the database of
// dbURL (a mysql:// URL, see driver/mysql.ParseURL, or a DSN of
// github.com/go-sql-driver/mysql) and publishing through pub. The same
// user, address and TLS settings (Config.TLS, else the URL's sslmode,
// sslrootcert, sslcert and sslkey, or its tls) serve the replication
// connection: it needs the REPLICATION SLAVE and REPLICATION CLIENT
// (BINLOG MONITOR) privileges, and mysql_native_password or (MySQL 8's
// default) caching_sha2_password authentication.
func New(dbURL string, pub broker.Publisher, cfg Config) (*Relay, error) {
	if pub == nil {
		return nil, errors.New("idem: binlog: New: nil publisher")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var mc *gomysql.Config
	var err error
	if strings.Contains(dbURL, "://") {
		mc, err = mysql.ParseURL(dbURL)
	} else {
		mc, err = gomysql.ParseDSN(dbURL)
	}
	if err != nil {
		return nil, fmt.Errorf("idem: binlog: database URL: %w", err)
	}
	if cfg.TLS != nil {
		mc.TLS, mc.AllowFallbackToPlaintext = cfg.TLS.Clone(), false
		if host, _, err := net.SplitHostPort(mc.Addr); err == nil && mc.TLS.ServerName == "" {
			mc.TLS.ServerName = host
		}
	}
	if mc.AllowFallbackToPlaintext {
		return nil, errors.New("idem: binlog: database URL: tls=preferred falls back to plain text, which the relay does not do: ask for TLS (sslmode=verify-full&sslrootcert=ca.pem) or remove tls=")
	}
	if cfg.Tables.Schema == "" && mc.DBName == "" {
		return nil, errors.New("idem: binlog: database URL: name the database (mysql://user:pass@host:port/DB) or set Config.Tables.Schema")
	}
	db, err := mysql.OpenConfig(mc)
	if err != nil {
		return nil, fmt.Errorf("idem: binlog: database URL: %w", err)
	}
	log := cfg.Logger.With("relay", "binlog")
	r := &source{
		cfg: cfg, log: log, db: db,
		// go-sql-driver, which logs the SQL connections in with the same
		// credentials, asks MySQL for its RSA key when caching_sha2_password
		// wants the password and the connection has no TLS: the
		// replication connection may as well.
		repl: mysqlrepl.Config{Network: mc.Net, Addr: mc.Addr, User: mc.User, Password: mc.Passwd,
			ServerID: cfg.ServerID, Heartbeat: cfg.Heartbeat, DialTimeout: mc.Timeout, TLS: mc.TLS,
			AllowPublicKeyRetrieval: true},
		schema: cfg.Tables.Schema,
	}
	if r.schema == "" {
		r.schema = mc.DBName
	}
	if r.repl.ServerID == 0 {
		r.cfg.ServerID = DefaultServerID(idem.Tables{Schema: r.schema, Outbox: cfg.Tables.Outbox})
		r.repl.ServerID = r.cfg.ServerID
	}
	r.eng = logengine.New(r, logengine.Config{
		Name: "binlog", Publisher: pub, Tracing: sendspan.New(TracerName, cfg.TracerProvider, cfg.Propagator, pub),
		Window: cfg.Window, BatchSize: cfg.BatchSize, QuarantineAfter: cfg.QuarantineAfter, Delete: cfg.Delete,
		FlushInterval: cfg.FlushInterval, PublishTimeout: cfg.PublishTimeout, RetryBackoff: cfg.RetryBackoff,
		MaxRetryBackoff: cfg.MaxRetryBackoff, QueryTimeout: cfg.QueryTimeout, StandbyPoll: cfg.StandbyPoll,
		ArchiveRetention: cfg.ArchiveRetention, ArchivePurgeInterval: cfg.ArchivePurgeInterval, DueInterval: cfg.DueInterval,
		ProgressInterval: cfg.ProgressInterval, Now: cfg.Now, Logger: log, Observer: cfg.Observer, OnQuarantine: cfg.OnQuarantine,
		Standby: "another process reads this outbox's binlog; waiting to take over", TookOver: "took the outbox's binlog over",
	})
	return &Relay{Relay: r.eng, src: r}, nil
}

// Close releases the outbox's lock and the connections once the relay
// stopped.
func (r *source) Close() {
	if r.lock != nil {
		r.release(r.lock)
		r.lock = nil
	}
	_ = r.db.Close()
}

// ResetPosition forgets the stored position of the binlog relay of the
// outbox tables.Outbox, in the database of dbURL: the next start publishes
// the rows waiting in the outbox, then reads the binlog from the server's
// current position ("idem cdc reset-position"). It is the way back after
// the server purged the binlog holding the stored position
// (ErrPositionPurged). Stop the relay first: a running relay stores its
// position again.
func ResetPosition(ctx context.Context, dbURL string, tables idem.Tables) error {
	tables = tables.WithDefaults()
	if err := tables.Validate(); err != nil {
		return fmt.Errorf("idem: binlog: %w", err)
	}
	db, err := mysql.Open(dbURL)
	if err != nil {
		return fmt.Errorf("idem: binlog: database URL: %w", err)
	}
	defer db.Close()
	table := mysql.QuoteIdent(tables.BinlogPosition)
	if tables.Schema != "" {
		table = mysql.QuoteIdent(tables.Schema) + "." + table
	}
	if _, err := db.ExecContext(ctx, `DELETE FROM `+table+` WHERE outbox_table = ?`, tables.Outbox); err != nil {
		return fmt.Errorf("idem: binlog: forget the position: %w", err)
	}
	return nil
}
