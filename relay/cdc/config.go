package cdc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/progress"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay/logrelay"
)

// Defaults of Config that only this relay has; the others are in package
// relay/logrelay.
const (
	// StandbyIntervalDefault is how often the relay sends a standby status
	// update when nothing else makes it send one.
	StandbyIntervalDefault = 10 * time.Second
	// LagWarnBytesDefault is the retained WAL above which the relay warns.
	LagWarnBytesDefault = 1 << 30
)

// Config configures a Relay. The zero value is valid: every field has a
// default.
type Config struct {
	// Tables names the outbox: Tables.Schema and Tables.Outbox. Defaults to
	// the connection's current schema and "outbox".
	Tables idem.Tables
	// Slot is the logical replication slot. Defaults to
	// "idem_<schema>_<table>" (schema "public" when Tables.Schema is
	// empty), lower-cased, every character other than a-z, 0-9 and _
	// replaced by _. A slot keeps the WAL from its confirmed position on:
	// drop it (DropSlot, "idem cdc drop-slot") when retiring a relay.
	Slot string
	// Publication is the publication the slot reads (1 to 63 characters
	// among a-z, 0-9 and _). Defaults to Slot. The
	// relay creates it at start, for inserts into the outbox only, when it
	// does not exist (which needs the ownership of the table); a DBA may
	// create it beforehand instead.
	Publication string
	// MessagePrefix is the prefix of the WAL messages the relay reads
	// (outbox.NewLogWriter). Defaults to outbox.LogPrefix(Tables),
	// "idem.outbox:<schema>.<table>", which is also the default of
	// outbox.NewLogWriter for the same tables.
	MessagePrefix string
	// Window is the largest number of messages handed to the broker and not
	// yet confirmed. Defaults to 1000.
	Window int
	// BatchSize is the largest number of messages in one Publish call.
	// Defaults to 200 (at most Window).
	BatchSize int
	// Delete says what happens to published rows. Defaults to
	// logrelay.DeletePublished.
	Delete logrelay.DeleteMode
	// StandbyInterval is how often a standby status update is sent when
	// nothing else makes the relay send one. It must stay well below the
	// server's wal_sender_timeout (60s by default). Each such update asks
	// the server for a reply: a replication connection on which the server
	// answers nothing for three intervals (at least 10s) is taken for dead
	// (a frozen or unreachable server), and the relay connects again.
	// Defaults to 10s.
	StandbyInterval time.Duration
	// FlushInterval is how often a newly confirmed position is reported to
	// the server. Defaults to 200ms.
	FlushInterval time.Duration
	// PublishTimeout bounds each Publish call. Defaults to 10s.
	PublishTimeout time.Duration
	// RetryBackoff is the first delay before a failed publish is retried,
	// and before a reconnection; it doubles up to MaxRetryBackoff, with
	// jitter. Defaults to 100ms.
	RetryBackoff time.Duration
	// MaxRetryBackoff caps those delays. Defaults to 5s.
	MaxRetryBackoff time.Duration
	// QuarantineAfter is the number of attempts on which the broker must
	// refuse a message itself (unroutable, nacked, rejected, too large: an
	// error for that message in a *broker.BatchError) before the relay
	// quarantines it, so that one message no broker will take does not hold
	// the slot's position, and the WAL behind it, for good. Defaults to 10,
	// about 20 s of refusals with the default backoff; negative retries
	// refused messages forever.
	//
	// A quarantined row gets quarantined_at and last_error in the outbox,
	// as with the polling relay; a WAL message (or a row its writer deleted)
	// is written into the outbox as a quarantined row. "idem failed list
	// --relay" shows them, "idem failed retry --relay" publishes them again
	// (the CDC relay reads the row it re-inserts), "idem failed remove
	// --relay" drops them. The later messages of its aggregate go on.
	//
	// Failures that say the broker did not answer (the whole Publish call
	// failed, or per message: a deadline, a lost connection, an error
	// marked idem.Transient) never count: they are retried for as long as
	// they last.
	QuarantineAfter int
	// LagWarnBytes: the relay logs a warning when the slot retains more WAL
	// than this (checked every StandbyInterval). Defaults to 1 GiB;
	// negative turns the warning off.
	LagWarnBytes int64
	// QueryTimeout bounds each SQL statement of the relay. Defaults to 30s.
	QueryTimeout time.Duration
	// DueInterval is how often the relay looks in the table for delayed
	// rows (idem.Event.NotBefore) that fell due, while it reads the slot:
	// a delayed row is published within about DueInterval of its time.
	// Defaults to 1s.
	DueInterval time.Duration
	// Now is the clock that says which delayed rows are due. Defaults to
	// time.Now; tests set a clock of their own.
	Now func() time.Time

	// ArchiveRetention is how long the relay keeps the events it published
	// in the archive, the table Tables.OutboxArchive ("outbox_archive",
	// migration 0013; one for every outbox of the schema), for "idem replay" (relay.Replay) to publish a period again:
	// this relay leaves no published row in the outbox (it deletes its
	// rows, or leaves them to their writer unmarked with KeepRows, and a WAL
	// message is no row at all). Each confirmed batch is written there in
	// the statement that deletes its rows, before its position is confirmed
	// to the server, so that neither a crash nor a stop loses an archived
	// event or keeps one twice; events archived longer ago than this are
	// deleted every ArchivePurgeInterval. It is the replay window of this
	// outbox: keep the consumers' processed_event markers at least this
	// long. Defaults to 7 days, as the polling relay's Retention; negative
	// turns the archive off (nothing is written, and "idem replay" finds
	// nothing this relay published).
	ArchiveRetention time.Duration
	// ArchivePurgeInterval is how often archived events older than
	// ArchiveRetention are deleted. Defaults to 1m.
	ArchivePurgeInterval time.Duration

	// RowsOnly declares that every event of the outbox is a row that stays
	// in the table until the relay deletes it: no writer emits WAL messages
	// (outbox.NewLogWriter) or deletes its own rows, and Delete is
	// logrelay.DeletePublished. Such an outbox survives a failover to a standby that
	// has no copy of the slot (logical slots are not replicated before
	// PostgreSQL 17): the relay finds the slot missing on the new primary,
	// creates it again and publishes the rows still in the table (some a
	// second time; consumers deduplicate). It needs idem's seq, published_at
	// and quarantined_at columns. See AcceptFailoverLoss.
	RowsOnly bool
	// AcceptFailoverLoss lets the relay start on a server that has a
	// physical standby (a walsender, or a physical slot) while its slot
	// cannot follow a failover (PostgreSQL before 17, or a slot created
	// without failover), for an outbox that is not RowsOnly. Without it
	// Start refuses (ErrFailoverLoss): the events that exist only in the
	// WAL (WAL messages, rows their writer deleted, rows kept with
	// KeepRows) and were not published when the primary fails are lost
	// with the slot, and so are those written on the new primary before the
	// relay creates the slot again; the relay cannot tell which. Set it only
	// when that loss is accepted, or the events can be replayed from
	// another record.
	AcceptFailoverLoss bool
	// Logger receives the relay's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// ProgressInterval is how often the relay logs how far it is in
	// publishing the rows that waited in the outbox when its slot was
	// created (Stats.InitialRows): published of total, rate, time left.
	// Defaults to 10s.
	ProgressInterval time.Duration

	// Observer is told what the relay does, for metrics: package
	// relay/cdc/cdcmetrics makes one that feeds Prometheus.
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

var slotChars = regexp.MustCompile(`[^a-z0-9_]`)

// SlotName returns the default slot name of an outbox table:
// "idem_<schema>_<table>", schema "public" when empty, lower-cased, with
// every character other than a-z, 0-9 and _ replaced by _.
func SlotName(t idem.Tables) string {
	t = t.WithDefaults()
	name := strings.ToLower("idem_" + cmp.Or(t.Schema, "public") + "_" + t.Outbox)
	name = slotChars.ReplaceAllString(name, "_")
	if len(name) > 63 {
		name = name[:63]
	}
	return name
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.Tables = c.Tables.WithDefaults()
	c.Slot = cmp.Or(c.Slot, SlotName(c.Tables))
	c.Publication = cmp.Or(c.Publication, c.Slot)
	c.MessagePrefix = cmp.Or(c.MessagePrefix, outbox.LogPrefix(c.Tables))
	c.Window = cmp.Or(c.Window, logrelay.WindowDefault)
	c.BatchSize = min(cmp.Or(c.BatchSize, logrelay.BatchSizeDefault), c.Window)
	c.StandbyInterval = cmp.Or(c.StandbyInterval, StandbyIntervalDefault)
	c.FlushInterval = cmp.Or(c.FlushInterval, logrelay.FlushIntervalDefault)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, logrelay.PublishTimeoutDefault)
	c.RetryBackoff = cmp.Or(c.RetryBackoff, logrelay.RetryBackoffDefault)
	c.MaxRetryBackoff = cmp.Or(c.MaxRetryBackoff, logrelay.MaxRetryBackoffDefault)
	c.QuarantineAfter = cmp.Or(c.QuarantineAfter, logrelay.QuarantineAfterDefault)
	c.LagWarnBytes = cmp.Or(c.LagWarnBytes, LagWarnBytesDefault)
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

var slotRE = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

func (c Config) validate() error {
	if err := c.Tables.Validate(); err != nil {
		return fmt.Errorf("idem: cdc: Config.Tables: %w", err)
	}
	if !slotRE.MatchString(c.Slot) {
		return fmt.Errorf("idem: cdc: Config.Slot %q: a slot name has 1 to 63 characters among a-z, 0-9 and _", c.Slot)
	}
	if !slotRE.MatchString(c.Publication) {
		return fmt.Errorf("idem: cdc: Config.Publication %q: a publication name here has 1 to 63 characters among a-z, 0-9 and _", c.Publication)
	}
	if c.Window < 1 {
		return fmt.Errorf("idem: cdc: Config.Window %d: must be positive", c.Window)
	}
	if c.BatchSize < 1 {
		return fmt.Errorf("idem: cdc: Config.BatchSize %d: must be positive", c.BatchSize)
	}
	if c.Delete != logrelay.DeletePublished && c.Delete != logrelay.KeepRows {
		return fmt.Errorf("idem: cdc: Config.Delete %v: unknown mode", c.Delete)
	}
	if c.RowsOnly && c.Delete != logrelay.DeletePublished {
		return errors.New("idem: cdc: Config.RowsOnly with Delete = KeepRows: kept rows cannot tell which of them wait, so a failover loses them; drop one of the two")
	}
	for name, d := range map[string]time.Duration{"StandbyInterval": c.StandbyInterval, "FlushInterval": c.FlushInterval,
		"PublishTimeout": c.PublishTimeout, "RetryBackoff": c.RetryBackoff, "MaxRetryBackoff": c.MaxRetryBackoff, "QueryTimeout": c.QueryTimeout,
		"ArchivePurgeInterval": c.ArchivePurgeInterval, "DueInterval": c.DueInterval, "ProgressInterval": c.ProgressInterval} {
		if d < 0 {
			return fmt.Errorf("idem: cdc: Config.%s %v: must not be negative", name, d)
		}
	}
	return nil
}

// TracerName is the instrumentation scope of the CDC relay's spans.
const TracerName = "github.com/idem-go/idem/relay/cdc"

// Archiving reports whether the relay keeps the events it publishes in the
// archive (Config.ArchiveRetention not negative).
func (c Config) Archiving() bool { return c.WithDefaults().ArchiveRetention > 0 }
