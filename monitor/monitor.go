// Package monitor reads what an operator watches, from a database and
// optionally a broker: per outbox its backlog, the age of its oldest
// unpublished row and its last publish; per consumer its last processed
// event, how many it processed in the last minute, and its parked messages;
// per consumer on the broker, the messages waiting for it.
//
// "idem status" prints a Snapshot; package dashboard shows them over time.
//
//	src := monitor.New(postgres.NewPgx(pool), monitor.Options{Name: "orders"})
//	snap, err := src.Snapshot(ctx)
package monitor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver"
)

// Database is what a Source reads: any driver (postgres.NewPgx(pool),
// postgres.NewSQL(db), mysql.New(db), sqlite.New(db)).
type Database interface {
	Dialect() driver.Dialect
	Pool() driver.Executor
}

// Options configures a Source.
type Options struct {
	// Name labels the database in reports (a service name); may be empty.
	Name string
	// Broker, when set, is asked for the messages waiting for each
	// consumer.
	Broker broker.Inspector
	// Consumers lists the consumers to report on besides those found in
	// the database (a consumer that has processed nothing yet).
	Consumers []string
	// BrokerTimeout bounds the broker's answer, so that a broker that
	// hangs does not hold the database's figures back (Snapshot.BrokerError
	// says so). Defaults to BrokerTimeoutDefault.
	BrokerTimeout time.Duration
}

// BrokerTimeoutDefault is Options.BrokerTimeout when it is zero.
const BrokerTimeoutDefault = 5 * time.Second

// Source takes snapshots of one database (and broker).
type Source struct {
	db   Database
	opts Options
}

// New returns a Source over db.
func New(db Database, opts Options) *Source {
	return &Source{db: db, opts: opts}
}

// Name returns Options.Name.
func (s *Source) Name() string { return s.opts.Name }

// Snapshot is the state of one database (and broker) at one time.
type Snapshot struct {
	// Database is the Source's name.
	Database string
	// Taken is when the snapshot was read (the database's clock).
	Taken time.Time
	// Outbox is the outbox table's state; Outbox.Present is false when the
	// database has none (a consumer-only database).
	Outbox OutboxStatus
	// Consumers are the consumers found in the database or named in
	// Options.Consumers, by name.
	Consumers []ConsumerStatus
	// Queues are the broker's figures per consumer; empty without a broker.
	Queues []broker.QueueStats
	// BrokerError says why Queues is empty although a broker was given.
	BrokerError string
	// Partitions are the partitions of the consumers' ownership groups
	// (inbox.Group), by consumer and number; empty when no group ran on
	// the database.
	Partitions []PartitionStatus
	// Pauses are the operators' pauses in force or scheduled, of the
	// consumers and the relays of the database (inbox.PauseStore,
	// relay.PauseStore), sorted by kind then name; ended ones are left
	// out. Empty on a database without their table (migration 0015).
	Pauses []idem.Pause
}

// OutboxStatus is an outbox table's state.
type OutboxStatus struct {
	// Table is the table's qualified name.
	Table string
	// Present is false when the database has no outbox table.
	Present bool
	// Backlog counts unpublished rows that are not quarantined and are
	// due: delayed rows not due yet are counted in Scheduled instead.
	Backlog int64
	// Quarantined counts quarantined rows ("idem failed list --relay").
	Quarantined int64
	// Scheduled counts the delayed rows (idem.Event.NotBefore) not due yet,
	// and NextDue is the earliest of their due times (zero when none).
	Scheduled int64
	NextDue   time.Time
	// OldestUnpublished is when the oldest unpublished row was written;
	// zero when there is none.
	OldestUnpublished time.Time
	// LastPublished is the latest publication time; zero when nothing was
	// published (or published rows were all deleted by retention).
	LastPublished time.Time
	// LogPosition is the position a relay reading the database's log
	// stored for the outbox (MariaDB's binlog relay: its GTID position),
	// and LogPositionAt when; empty when none did.
	LogPosition   string
	LogPositionAt time.Time
	// ArchiveOldest and ArchiveNewest are when the oldest and the newest
	// event of the CDC relays' archive (outbox_archive, which "idem
	// replay" reads) were published: the period a replay can cover. Zero
	// when the database has no archive or it is empty.
	ArchiveOldest, ArchiveNewest time.Time
}

// ConsumerStatus is one consumer's state in its database.
type ConsumerStatus struct {
	// Name is the consumer's name (its processed_event.consumer_name).
	Name string
	// LastProcessed is when it last processed an event; zero when never
	// (or its markers were purged).
	LastProcessed time.Time
	// ProcessedLastMinute counts the events it processed in the minute
	// before Snapshot.Taken.
	ProcessedLastMinute int64
	// Parked counts its messages in the failure store.
	Parked int64
	// OldestParked is when its oldest parked message first failed; zero
	// when none.
	OldestParked time.Time
	// Retrying counts its events with failed attempts recorded and neither
	// applied nor parked yet: waiting for a retry.
	Retrying int64
}

// Snapshot reads the database (and broker) now. A database without idem's consumer tables gives an error wrapping
// idem.ErrMissingTable, which says to run "idem migrate up"; one without an
// outbox table (a consumer-only database) has Outbox.Present false. A
// broker that fails leaves Queues empty and says why in BrokerError: the
// database's figures are still worth showing.
func (s *Source) Snapshot(ctx context.Context) (Snapshot, error) {
	d := s.db.Dialect()
	st, err := d.ReadStatus(ctx, s.db.Pool(), driver.StatusParams{Consumers: s.opts.Consumers, Window: time.Minute})
	if err != nil {
		return Snapshot{}, fmt.Errorf("idem: monitor: %s: %w", cmp.Or(s.opts.Name, d.Name()), err)
	}
	t := d.Tables()
	snap := Snapshot{
		Database: s.opts.Name,
		Taken:    st.Now,
		Outbox: OutboxStatus{
			Table:             qualified(t.Schema, t.Outbox),
			Present:           st.Outbox.Present,
			Backlog:           st.Outbox.Backlog,
			Quarantined:       st.Outbox.Quarantined,
			Scheduled:         st.Outbox.Scheduled,
			NextDue:           st.Outbox.NextDue,
			OldestUnpublished: st.Outbox.OldestUnpublished,
			LastPublished:     st.Outbox.LastPublished,
			LogPosition:       st.Outbox.LogPosition,
			LogPositionAt:     st.Outbox.LogPositionAt,
		},
		Consumers: make([]ConsumerStatus, len(st.Consumers)),
	}
	if a, ok := d.(driver.OutboxArchiver); ok && st.Outbox.Present {
		// Three reads of the archive's indexes: cheap at any size.
		info, err := a.ArchiveInfo(ctx, s.db.Pool())
		if err != nil {
			return Snapshot{}, fmt.Errorf("idem: monitor: %s: the outbox's archive: %w", cmp.Or(s.opts.Name, d.Name()), err)
		}
		if info.Exists && !info.Empty {
			snap.Outbox.ArchiveOldest, snap.Outbox.ArchiveNewest = info.OldestPublished, info.NewestPublished
		}
	}
	names := make([]string, len(st.Consumers))
	for i, c := range st.Consumers {
		names[i] = c.Name
		snap.Consumers[i] = ConsumerStatus{
			Name:                c.Name,
			LastProcessed:       c.LastProcessed,
			ProcessedLastMinute: c.Processed,
			Parked:              c.Parked,
			OldestParked:        c.OldestParked,
			Retrying:            c.Retrying,
		}
	}
	if s.opts.Broker != nil && len(names) > 0 {
		bctx, cancel := context.WithTimeout(ctx, cmp.Or(s.opts.BrokerTimeout, BrokerTimeoutDefault))
		qs, err := s.opts.Broker.Inspect(bctx, names)
		cancel()
		if err != nil {
			snap.BrokerError = broker.RedactURL(err.Error()) // the text may quote the broker's URL
		} else {
			snap.Queues = qs
		}
	}
	if snap.Partitions, err = readPartitions(ctx, s.db, snap.Queues); err != nil {
		return Snapshot{}, fmt.Errorf("idem: monitor: %s: consumer partitions: %w", cmp.Or(s.opts.Name, d.Name()), err)
	}
	ps, err := d.ListPauses(ctx, s.db.Pool(), "", "")
	if err != nil && !errors.Is(err, idem.ErrMissingTable) {
		return Snapshot{}, fmt.Errorf("idem: monitor: %s: pauses: %w", cmp.Or(s.opts.Name, d.Name()), err)
	}
	for _, p := range ps {
		if !p.EndedAt(st.Now) {
			snap.Pauses = append(snap.Pauses, p)
		}
	}
	return snap, nil
}

// Consumer returns the status of the consumer called name.
func (s Snapshot) Consumer(name string) (ConsumerStatus, bool) {
	for _, c := range s.Consumers {
		if c.Name == name {
			return c, true
		}
	}
	return ConsumerStatus{}, false
}

// Queue returns the broker's figures of the consumer called name.
func (s Snapshot) Queue(name string) (broker.QueueStats, bool) {
	for _, q := range s.Queues {
		if q.Consumer == name {
			return q, true
		}
	}
	return broker.QueueStats{}, false
}

// OldestUnpublishedAge is how long the oldest unpublished row has waited
// at Taken; zero when there is none.
func (s Snapshot) OldestUnpublishedAge() time.Duration {
	return age(s.Taken, s.Outbox.OldestUnpublished)
}

func age(now, t time.Time) time.Duration {
	if t.IsZero() || now.Before(t) {
		return 0
	}
	return now.Sub(t)
}

func qualified(schema, table string) string {
	if schema == "" {
		return table
	}
	return schema + "." + table
}

// Pause returns the pause of kind and name in force or scheduled, if any.
func (s Snapshot) Pause(kind idem.PauseKind, name string) (idem.Pause, bool) {
	for _, p := range s.Pauses {
		if p.Kind == kind && p.Name == name {
			return p, true
		}
	}
	return idem.Pause{}, false
}
