package driver

import (
	"context"
	"time"
)

// StatusReader is the part of a Dialect that reads, cheaply, what an
// operator watches ("idem status", package monitor, the dashboard). The
// conformance suite (drivertest.Status) checks it.
//
// Cheap means that no statement reads all of processed_event: consumer
// names are found by skipping through the (consumer_name, event_id) key,
// and each consumer's figures come from its own range of the
// (consumer_name, processed_at) index (migration 0005; without it the
// figures are right but slower). The failure store and delivery_attempt
// are read per consumer through their consumer_name indexes; the outbox
// through its partial indexes (the backlog count reads every pending row's
// index entry, which is the figure itself).
type StatusReader interface {
	// ReadStatus returns the figures of the outbox and of every consumer
	// found in processed_event, failed_message or delivery_attempt, plus
	// p.Consumers. A database without an outbox table (a consumer-only
	// one) has Outbox.Present false; a missing consumer table is an error
	// wrapping idem.ErrMissingTable.
	ReadStatus(ctx context.Context, ex Executor, p StatusParams) (Status, error)
}

// StatusParams are the arguments of StatusReader.ReadStatus.
type StatusParams struct {
	// Consumers are consumer names to report besides those found in the
	// tables (a consumer that has processed nothing yet).
	Consumers []string
	// Window is the period before Status.Now whose processed events
	// ConsumerStatus.Processed counts. Zero means StatusWindowDefault.
	Window time.Duration
}

// StatusWindowDefault is StatusParams.Window when it is zero: one minute.
const StatusWindowDefault = time.Minute

// WindowOrDefault returns p.Window, or StatusWindowDefault when it is not
// positive.
func (p StatusParams) WindowOrDefault() time.Duration {
	if p.Window <= 0 {
		return StatusWindowDefault
	}
	return p.Window
}

// Status is what StatusReader.ReadStatus returns.
type Status struct {
	// Now is the database's clock when the figures were read: ages are
	// measured from it, so that a client's clock skew does not show.
	Now time.Time
	// Outbox is the outbox table's state.
	Outbox OutboxStatus
	// Consumers are sorted by name.
	Consumers []ConsumerStatus
}

// OutboxStatus is the state of an outbox table.
type OutboxStatus struct {
	// Present is false when the database has no outbox table.
	Present bool
	// Backlog counts unpublished rows that are not quarantined (including
	// those that wait behind a quarantined row) and are due: delayed rows
	// not due yet are counted in Scheduled instead.
	Backlog int64
	// Quarantined counts quarantined rows.
	Quarantined int64
	// Scheduled counts the delayed rows (idem.Event.NotBefore) not due yet
	// by the database's clock, and NextDue is the earliest of their due
	// times (zero when none).
	Scheduled int64
	NextDue   time.Time
	// OldestUnpublished is the created_at of the unpublished, unquarantined,
	// undelayed row with the lowest seq, or the due time of a delayed row
	// due before it (it has waited since then); zero when there is none.
	OldestUnpublished time.Time
	// LastPublished is the latest published_at; zero when no row is marked
	// published (none yet, or retention deleted them).
	LastPublished time.Time
	// LogPosition is the position a relay reading the database's log
	// stored for this outbox (MariaDB's binlog relay: a GTID position), and
	// LogPositionAt when it stored it; empty when none did.
	LogPosition   string
	LogPositionAt time.Time
}

// ConsumerStatus is one consumer's state in its database.
type ConsumerStatus struct {
	// Name is the consumer's name.
	Name string
	// LastProcessed is the latest processed_at of its markers; zero when it
	// has none (never processed, or purged).
	LastProcessed time.Time
	// Processed counts its markers processed in the window before
	// Status.Now (StatusParams.Window).
	Processed int64
	// Parked counts its entries in the failure store, those held behind
	// another included.
	Parked int64
	// OldestParked is the earliest first failure among them; zero when
	// none.
	OldestParked time.Time
	// Retrying counts its events with failed attempts recorded in
	// delivery_attempt: waiting for a retry, neither applied nor parked yet.
	Retrying int64
}
