// Package logrelay holds what the log relays share and show: the relays
// that read the database's log rather than poll the outbox, relay/cdc
// (PostgreSQL's logical replication) and relay/binlog (MariaDB's binary
// log). Their Stats, their Observer and its Stages, what happens to the
// rows they published (DeleteMode), and the defaults of the Config fields
// they have in common.
//
// Both relays are thin adapters over one engine: they publish, order,
// check visibility, confirm, delay, quarantine, archive and report the
// same way, so one set of types describes them, and a program that runs
// either one holds it as a Relay.
package logrelay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/failgroup"
)

// Defaults of the Config fields that relay/cdc and relay/binlog share.
const (
	// WindowDefault is the number of messages read and not yet confirmed
	// by the broker.
	WindowDefault = 1000
	// BatchSizeDefault is the largest number of messages in one Publish
	// call.
	BatchSizeDefault = 200
	// FlushIntervalDefault is how often a confirmed position is made
	// durable (confirmed to PostgreSQL, stored in MariaDB), after the
	// published rows are deleted.
	FlushIntervalDefault = 200 * time.Millisecond
	// PublishTimeoutDefault bounds each Publish call.
	PublishTimeoutDefault = 10 * time.Second
	// RetryBackoffDefault is the first delay before a failed publish or
	// connection is retried; it doubles up to MaxRetryBackoffDefault.
	RetryBackoffDefault = 100 * time.Millisecond
	// MaxRetryBackoffDefault caps the delay between retries of a publish,
	// and between reconnections.
	MaxRetryBackoffDefault = 5 * time.Second
	// QuarantineAfterDefault is the number of refusals after which a
	// message is quarantined.
	QuarantineAfterDefault = 10
	// QueryTimeoutDefault bounds the relays' SQL statements.
	QueryTimeoutDefault = 30 * time.Second
	// ArchiveRetentionDefault is how long the archive keeps the events a
	// relay published: the period "idem replay" can publish again, the
	// polling relay's relay.RetentionDefault.
	ArchiveRetentionDefault = 7 * 24 * time.Hour
	// ArchivePurgeIntervalDefault is how often the events archived longer
	// ago than the retention are deleted.
	ArchivePurgeIntervalDefault = time.Minute
	// ArchivePurgeBatchSize is the number of archived events deleted per
	// statement.
	ArchivePurgeBatchSize = 1000
	// DueIntervalDefault is how often a relay looks for delayed rows that
	// fell due.
	DueIntervalDefault = time.Second
)

// DeleteMode says what happens to the outbox rows a relay published.
type DeleteMode int

const (
	// DeletePublished deletes each published row once the broker confirmed
	// it, before its transaction's position is made durable (a crash in
	// between publishes it again from the log). The default: the table
	// stays small without a retention job.
	DeletePublished DeleteMode = iota
	// KeepRows leaves the rows alone: the writer deletes them itself, often
	// in the same transaction as the insert (Debezium's "insert then
	// delete": the insert is in the log either way), or a job of its own
	// does. Deletes in the log are always ignored.
	KeepRows
)

// String returns "delete" or "keep".
func (m DeleteMode) String() string {
	switch m {
	case DeletePublished:
		return "delete"
	case KeepRows:
		return "keep"
	}
	return fmt.Sprintf("DeleteMode(%d)", int(m))
}

// Relay is what every log relay does: *cdc.Relay and *binlog.Relay are
// Relays.
type Relay interface {
	// Start checks the server and the tables, and starts reading the log
	// in the background; ctx bounds the start-up only. When another
	// process holds the log, the relay waits and takes over when it is
	// released (Stats.Waiting): Start does not fail for that.
	Start(ctx context.Context) error
	// Stop stops reading, waits for the messages handed to the broker,
	// deletes the published rows and makes the position durable, then
	// returns. When ctx ends first, the publishing in progress is
	// abandoned (those messages are published again by the next relay)
	// and Stop returns ctx's error at once; Done is closed when everything
	// has ended. Stop is idempotent, and safe before, during and after
	// Start.
	Stop(ctx context.Context) error
	// Done is closed when the relay has stopped.
	Done() <-chan struct{}
	// Stats returns a snapshot of the relay's counters.
	Stats() Stats
	// Healthy returns nil while the relay reads its log, or waits for the
	// log held by another process (a standby); otherwise ErrNotRunning or
	// the error that keeps it from reading.
	Healthy() error
}

// ErrNotRunning is returned by a relay's Healthy while it is not running.
var ErrNotRunning = errors.New("idem: log relay not running")

// Stats is a snapshot of a log relay's counters. A field that only one of
// the logs has says so.
type Stats struct {
	// Published counts the messages the broker confirmed.
	Published int64
	// PublishCalls and PublishFailures count the Publish calls, and those
	// that failed (whole or in part; each is retried).
	PublishCalls, PublishFailures int64
	// Transactions counts the committed transactions read that held
	// outbox events.
	Transactions int64
	// Unreadable counts the rows (and PostgreSQL's WAL messages) that could
	// not become messages, quarantined ones included.
	Unreadable int64
	// Quarantined counts the rows quarantined in the outbox table.
	Quarantined int64
	// Deleted counts the published rows deleted.
	Deleted int64
	// Archived counts the events written into the archive
	// (Config.ArchiveRetention), and ArchivePurged those deleted from it
	// after the retention.
	Archived, ArchivePurged int64
	// Delayed counts the inserts of delayed rows (idem.Event.NotBefore)
	// the log reader left in the table to wait for their time, and
	// DuePublished the delayed rows published from the table once due.
	Delayed, DuePublished int64
	// InitialRows is the number of rows that waited in the outbox when the
	// relay first read its log (the log after that point does not hold
	// them: the relay publishes them first, from a snapshot of the table),
	// and InitialDone how many of them are published or quarantined so
	// far; both 0 when none waited. The relay logs how far it is every
	// Config.ProgressInterval.
	InitialRows, InitialDone int64
	// VisibilityWaits counts the checks that found a transaction the log
	// sent as committed not yet visible to other sessions: its messages,
	// and those after it, waited (nothing is published before its
	// transaction is visible).
	VisibilityWaits int64
	// InFlight is the number of messages read and not yet confirmed.
	InFlight int64
	// Position is the position last made durable, as the log writes it:
	// an LSN ("0/16B3748") confirmed to PostgreSQL, a GTID position
	// ("0-1-42") stored in MariaDB's binlog_position. The log up to it is
	// published.
	Position string
	// ConfirmedLSN is Position as a number (PostgreSQL only).
	ConfirmedLSN uint64
	// File and FilePos are the binlog file and offset the relay read last
	// (MariaDB only).
	File    string
	FilePos uint64
	// LagBytes is the log written by the server after what the relay
	// confirmed (PostgreSQL: the slot's confirmed position) or read
	// (MariaDB), as of the last check.
	LagBytes int64
	// RetainedBytes is the WAL the slot keeps, from its restart position
	// (PostgreSQL only), as of the last check.
	RetainedBytes int64
	// Lag is the age of the oldest commit read and not yet confirmed; 0
	// when none waits.
	Lag time.Duration
	// Streaming is true while the relay reads the log; Waiting, while
	// another process holds it (this relay is a standby).
	Streaming, Waiting bool
	// LastError is the last error met, "" when none.
	LastError string
	// Paused is the operator's pause holding the relay (relay.PauseStore),
	// as last read; nil when none holds it.
	Paused *idem.Pause
}

// Observer is told what a log relay does, for metrics. Set it as the
// relay's Config.Observer (package relay/cdc/cdcmetrics makes one that
// feeds Prometheus). Its functions are called from several goroutines:
// they must be fast and safe for concurrent use. A nil function is not
// called.
type Observer struct {
	// Publish is called after each Publish call with its number of
	// messages, its duration and its error.
	Publish func(n int, d time.Duration, err error)
	// Confirm is called for each transaction whose position is made
	// durable, with the time from its commit to then.
	Confirm func(d time.Duration)
	// CommitToPublish is called for each published message with the time
	// from its transaction's commit to the broker's confirmation. MariaDB's
	// binlog timestamps have a resolution of one second: there it is that
	// coarse.
	CommitToPublish func(d time.Duration)
	// Stages is called for each published message with the parts of its
	// commit-to-confirmation time: where a relay's latency goes.
	Stages func(Stages)
}

// Stages splits a message's time from its transaction's commit to the
// broker's confirmation (Observer.CommitToPublish) into its parts, which
// add up to it.
type Stages struct {
	// Receive is from the commit (the server's commit timestamp) to the
	// relay's reading the transaction's end from the log: the server's
	// decoding and sending, and the relay's reading, including while its
	// window was full.
	Receive time.Duration
	// Visible is from then to the transaction's being seen visible to
	// other sessions (one check for the transactions read meanwhile).
	Visible time.Duration
	// Queue is from then to the start of the Publish call that carried the
	// message: waiting for the previous message of its aggregate, for a
	// free call, or for a failed call's retry.
	Queue time.Duration
	// Confirm is the Publish call that carried it: sending and the
	// broker's confirmation.
	Confirm time.Duration
}

// QuarantineNotice returns the notice (idem.FailureRowQuarantined) of the
// row rec of the outbox table (without its schema), quarantined for
// errText, dated now, with its class and group as "idem failed groups
// --relay" shows them: what every relay's Config.OnQuarantine receives.
func QuarantineNotice(table string, rec driver.OutboxRecord, errText string) idem.FailureNotice {
	class := failgroup.RelayClass(errText)
	n := idem.FailureNotice{
		Name: idem.FailureRowQuarantined, At: time.Now().UTC(), OutboxTable: table, OutboxSeq: rec.Seq,
		Class: class, Group: failgroup.ID(failgroup.RelayScope, class, failgroup.Normalize(errText)),
		EventName: rec.Type, AggregateType: rec.AggregateType, AggregateID: rec.AggregateID,
		Attempts: rec.Attempts + 1, Error: errText,
	}
	if id, err := uuid.Parse(rec.RawID); err == nil {
		n.EventID = id
	}
	return n
}
