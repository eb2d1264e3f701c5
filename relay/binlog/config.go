package binlog

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/progress"
	"github.com/idem-go/idem/relay/logrelay"
)

// Defaults of Config that only this relay has; the others are in package
// relay/logrelay.
const (
	// HeartbeatDefault is the period of the server's heartbeats while the
	// binlog is quiet.
	HeartbeatDefault = 5 * time.Second
	// StandbyPollDefault is how often a relay waiting for the outbox's lock
	// tries to take it.
	StandbyPollDefault = time.Second
)

// Config configures a Relay. The zero value is valid: every field has a
// default.
type Config struct {
	// Tables names the outbox (Tables.Schema, Tables.Outbox; defaults to
	// the database of the connection and "outbox") and the table holding
	// the relay's position (Tables.BinlogPosition, created by "idem
	// migrate").
	Tables idem.Tables
	// TLS, when set, encrypts the relay's connections to the server, its
	// SQL connections and its replication connection, instead of the TLS
	// settings of the database URL (sslmode, sslrootcert, sslcert and
	// sslkey, or tls: see driver/mysql.ParseURL), which both use otherwise.
	// Its ServerName defaults to the URL's host. The replication
	// connection fails when the server does not offer TLS.
	TLS *tls.Config
	// ServerID is the server_id the relay presents to the server, as a
	// replica does: it must differ from the server_id of every server and
	// replica of the topology. Defaults to DefaultServerID of the outbox
	// (its database resolved from the URL when Tables.Schema is empty).
	ServerID uint32
	// Window is the largest number of messages read and not yet confirmed
	// by the broker. Defaults to 1000.
	Window int
	// BatchSize is the largest number of messages in one Publish call.
	// Defaults to 200 (at most Window).
	BatchSize int
	// Delete says what happens to published rows. Defaults to
	// logrelay.DeletePublished.
	Delete logrelay.DeleteMode
	// FlushInterval is how often the confirmed position is stored.
	// Defaults to 200ms.
	FlushInterval time.Duration
	// Heartbeat is the period of the heartbeats the server sends while its
	// binlog is quiet; a connection on which the server sends nothing for
	// three periods (at least 10s) is taken for dead. Defaults to 5s.
	Heartbeat time.Duration
	// StandbyPoll is how often a relay that waits for another process
	// holding the outbox's lock tries to take it. Defaults to 1s.
	StandbyPoll time.Duration
	// PublishTimeout bounds each Publish call. Defaults to 10s.
	PublishTimeout time.Duration
	// RetryBackoff is the first delay before a failed publish, or a
	// reconnection, is retried; it doubles up to MaxRetryBackoff, with
	// jitter. Defaults to 100ms.
	RetryBackoff time.Duration
	// MaxRetryBackoff caps those delays. Defaults to 5s.
	MaxRetryBackoff time.Duration
	// QuarantineAfter is the number of refusals of a message by the broker
	// itself (unroutable, nacked, too large) after which the relay
	// quarantines it in the outbox table, so that one message no broker
	// takes does not hold the position for good. Faults (the broker did not
	// answer) never count. Defaults to 10; negative retries forever.
	QuarantineAfter int
	// QueryTimeout bounds each SQL statement of the relay. Defaults to 30s.
	QueryTimeout time.Duration
	// ArchiveRetention is how long the relay keeps the events it published
	// in the archive, the table Tables.OutboxArchive ("outbox_archive",
	// migration 0013; one for every outbox of the database), for "idem replay" (relay.Replay) to publish a period again:
	// this relay leaves no published row in the outbox (it deletes its
	// rows, or leaves them to their writer unmarked with KeepRows). Each
	// confirmed batch is written there in the transaction that deletes its
	// rows, before its position is stored, so that neither a crash nor a
	// stop loses an archived event or keeps one twice; events archived
	// longer ago than this are deleted every ArchivePurgeInterval. It is the
	// replay window of this outbox: keep the consumers' processed_event
	// markers at least this long. Defaults to 7 days
	// (logrelay.ArchiveRetentionDefault); negative turns the archive off.
	ArchiveRetention time.Duration
	// ArchivePurgeInterval is how often archived events older than
	// ArchiveRetention are deleted. Defaults to 1m.
	ArchivePurgeInterval time.Duration
	// DueInterval is how often the relay looks in the table for delayed
	// rows (idem.Event.NotBefore) that fell due, while it holds the
	// outbox: a delayed row is published within about DueInterval of its
	// time. Defaults to 1s.
	DueInterval time.Duration
	// Now is the clock that says which delayed rows are due. Defaults to
	// time.Now; tests set a clock of their own.
	Now func() time.Time
	// Logger receives the relay's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// ProgressInterval is how often the relay logs how far it is in
	// publishing the rows that waited in the outbox at its first start
	// (Stats.InitialRows): published of total, rate, time left. Defaults
	// to 10s.
	ProgressInterval time.Duration
	// Observer is told what the relay does, for metrics (package
	// relay/cdc/cdcmetrics makes one that feeds Prometheus). A
	// transaction's commit time comes from the binlog, whose timestamps
	// have a resolution of one second: CommitToPublish and Stages.Receive
	// are that coarse.
	Observer logrelay.Observer
	// OnQuarantine, when set, is called with the notice of each row or
	// message the relay quarantines (idem.FailureRowQuarantined: the row's
	// table and seq, class, group and error, its event's id, name and
	// aggregate), in the transaction that quarantines it: the notice
	// exists if and only if the quarantine committed, and an error rolls
	// it back (the message is published again). outbox.FailureEvents
	// writes the notices into the outbox, which the relay reads and
	// publishes ("idem cdc --failure-events"). Rows that are themselves
	// notices (idem.IsFailureNotice) get none.
	OnQuarantine func(ctx context.Context, ex driver.Executor, n idem.FailureNotice) error
	// TracerProvider gives the tracer of the relay's spans: one producer
	// span per published message, child of the span whose trace context
	// the row's headers carry (outbox.Writer writes it), so that one trace
	// runs from the request that wrote the event through the relay to every
	// consumer. Defaults to the global one (otel.GetTracerProvider), which
	// records nothing until an application installs an SDK.
	TracerProvider trace.TracerProvider
	// Propagator reads the producer's trace context from the rows'
	// headers. Defaults to the global one (otel.GetTextMapPropagator).
	Propagator propagation.TextMapPropagator
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.Tables = c.Tables.WithDefaults()
	c.Window = cmp.Or(c.Window, logrelay.WindowDefault)
	c.BatchSize = min(cmp.Or(c.BatchSize, logrelay.BatchSizeDefault), c.Window)
	c.FlushInterval = cmp.Or(c.FlushInterval, logrelay.FlushIntervalDefault)
	c.Heartbeat = cmp.Or(c.Heartbeat, HeartbeatDefault)
	c.StandbyPoll = cmp.Or(c.StandbyPoll, StandbyPollDefault)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, logrelay.PublishTimeoutDefault)
	c.RetryBackoff = cmp.Or(c.RetryBackoff, logrelay.RetryBackoffDefault)
	c.MaxRetryBackoff = cmp.Or(c.MaxRetryBackoff, logrelay.MaxRetryBackoffDefault)
	c.QuarantineAfter = cmp.Or(c.QuarantineAfter, logrelay.QuarantineAfterDefault)
	c.QueryTimeout = cmp.Or(c.QueryTimeout, logrelay.QueryTimeoutDefault)
	c.ArchiveRetention = cmp.Or(c.ArchiveRetention, logrelay.ArchiveRetentionDefault)
	c.ArchivePurgeInterval = cmp.Or(c.ArchivePurgeInterval, logrelay.ArchivePurgeIntervalDefault)
	c.DueInterval = cmp.Or(c.DueInterval, logrelay.DueIntervalDefault)
	c.ProgressInterval = cmp.Or(c.ProgressInterval, progress.IntervalDefault)
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// DefaultServerID returns the server_id a relay of the outbox t presents
// when Config.ServerID is not set: a number in [1<<30, 1<<31) derived from
// the schema and table names, far from the small numbers servers are
// usually given.
func DefaultServerID(t idem.Tables) uint32 {
	t = t.WithDefaults()
	h := fnv.New32a()
	_, _ = h.Write([]byte(t.Schema + "." + t.Outbox))
	return 1<<30 | h.Sum32()&(1<<30-1)
}

func (c Config) validate() error {
	if err := c.Tables.Validate(); err != nil {
		return fmt.Errorf("idem: binlog: Config.Tables: %w", err)
	}
	if c.Window < 1 {
		return fmt.Errorf("idem: binlog: Config.Window %d: must be positive", c.Window)
	}
	if c.BatchSize < 1 {
		return fmt.Errorf("idem: binlog: Config.BatchSize %d: must be positive", c.BatchSize)
	}
	if c.Delete != logrelay.DeletePublished && c.Delete != logrelay.KeepRows {
		return fmt.Errorf("idem: binlog: Config.Delete %v: unknown mode", c.Delete)
	}
	for name, d := range map[string]time.Duration{"FlushInterval": c.FlushInterval, "Heartbeat": c.Heartbeat,
		"StandbyPoll": c.StandbyPoll, "PublishTimeout": c.PublishTimeout, "RetryBackoff": c.RetryBackoff,
		"MaxRetryBackoff": c.MaxRetryBackoff, "QueryTimeout": c.QueryTimeout, "ArchivePurgeInterval": c.ArchivePurgeInterval} {
		if d < 0 {
			return fmt.Errorf("idem: binlog: Config.%s %v: must not be negative", name, d)
		}
	}
	if c.Heartbeat > 0 && c.Heartbeat < time.Millisecond {
		return errors.New("idem: binlog: Config.Heartbeat: at least 1ms")
	}
	return nil
}

// TracerName is the instrumentation scope of the binlog relay's spans.
const TracerName = "github.com/idem-go/idem/relay/binlog"
