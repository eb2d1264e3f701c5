package driver

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
)

// RelayDialect is the part of a Dialect that the relays (package relay,
// relay/cdc) and "idem failed ... --relay" use. A relay worker claims a batch of outbox rows under a lease
// (an owner token and an expiry), publishes them, then marks them published,
// releases them or quarantines them, all fenced by the owner token: a worker
// whose lease expired and was taken over changes nothing.
//
// Delayed rows (a not_before in the future, idem.Event.NotBefore) are not
// claimed before it: ClaimOutbox first clears not_before on the rows due
// at ClaimParams.Now, and claims only rows whose not_before is NULL. A row
// not due yet is invisible to the claim, so it holds back nothing of its
// aggregate: the later rows go when they are due, and it goes when it is,
// as its aggregate's head.
//
// Per-aggregate order rests on ClaimOutbox: it only claims an aggregate's head
// (its unpublished row with the lowest seq) and the rows that follow it, so
// two workers never hold rows of one aggregate at the same time. A head whose
// next unpublished row is under an unexpired lease (a row committed late, with
// a lower seq than rows already in flight) is not claimable until they are
// done. A quarantined head is never claimable: the later rows of its
// aggregate wait until it is requeued or deleted. Claims on one table must not
// run concurrently: each must see the leases of the previous ones.
//
// Rows are identified by seq: the id column holds whatever the program that
// wrote the row put there (another program's outbox may hold ids that are not
// UUIDs, or UUIDs in another spelling).
type RelayDialect interface {
	// ClaimOutbox leases up to p.Limit unpublished rows and returns them in
	// seq order. It must run in a transaction (ex is the transaction's
	// executor); the lease takes effect when the transaction commits. It
	// fails only when the database does; a row whose content cannot be read
	// is returned with OutboxRecord.Unreadable set.
	ClaimOutbox(ctx context.Context, ex Executor, p ClaimParams) ([]ClaimedRow, error)
	// MarkPublished sets published_at on the rows of seqs still leased by
	// owner, and returns how many it marked. Rows leased by someone else are
	// left alone.
	MarkPublished(ctx context.Context, ex Executor, owner uuid.UUID, seqs []int64) (int64, error)
	// ReleaseOutbox gives up the lease of rows still leased by owner, and
	// returns how many it released. A row with an Error sets last_error and
	// is not claimed (nor any later row of its aggregate) before Delay has
	// passed; when it is Refused, it also counts an attempt (attempts+1).
	ReleaseOutbox(ctx context.Context, ex Executor, owner uuid.UUID, rows []ReleaseRow) (int64, error)
	// QuarantineOutbox quarantines the rows still leased by owner:
	// quarantined_at set, last_error set, attempts+1, lease freed. Claims
	// skip them, and the later rows of their aggregates wait behind them,
	// until RequeueQuarantined or DeleteQuarantined. It returns the seqs it
	// quarantined, ascending.
	QuarantineOutbox(ctx context.Context, ex Executor, owner uuid.UUID, rows []QuarantineRow) ([]int64, error)
	// ListQuarantined returns the quarantined rows f selects, in seq order.
	ListQuarantined(ctx context.Context, ex Executor, f QuarantineFilter) ([]QuarantinedRow, error)
	// GetQuarantined returns the quarantined row seq, or idem.ErrNotFound when
	// there is none (or the row is not quarantined).
	GetQuarantined(ctx context.Context, ex Executor, seq int64) (QuarantinedRow, error)
	// RequeueQuarantined ends the quarantine of the rows of seqs that are
	// quarantined: quarantined_at and attempts cleared, last_error kept. A
	// relay claims them at its next claim. It returns how many it requeued.
	RequeueQuarantined(ctx context.Context, ex Executor, seqs []int64) (int64, error)
	// DeleteQuarantined deletes the rows of seqs that are quarantined and
	// returns how many it deleted. The next rows of their aggregates become
	// claimable.
	DeleteQuarantined(ctx context.Context, ex Executor, seqs []int64) (int64, error)
	// DeletePublished deletes at most limit rows published before before and
	// returns how many.
	DeletePublished(ctx context.Context, ex Executor, before time.Time, limit int) (int64, error)
	// OutboxBacklog reports the unpublished rows.
	OutboxBacklog(ctx context.Context, ex Executor) (Backlog, error)
	// NextDue returns the earliest not_before of the unpublished rows that
	// still have one (delayed rows not claimed yet, due or not), or the
	// zero time when there is none: an idle relay sleeps no longer than
	// until then. It reads one entry of an index.
	NextDue(ctx context.Context, ex Executor) (time.Time, error)
	// ReplayCounts counts the published rows f selects, per event name.
	ReplayCounts(ctx context.Context, ex Executor, f ReplayFilter) (map[string]int64, error)
	// ReplayRows returns up to limit published rows f selects with a seq
	// above afterSeq, in seq order: a page of a replay.
	ReplayRows(ctx context.Context, ex Executor, f ReplayFilter, afterSeq int64, limit int) ([]OutboxRecord, error)
}

// OutboxListener is implemented by drivers that can tell a relay when rows are
// added to the outbox (PostgreSQL LISTEN/NOTIFY). Relays on other drivers poll.
type OutboxListener interface {
	// ListenOutbox calls notify once listening has started, then after each
	// insert into the outbox (notifications may be coalesced or lost). It
	// blocks until ctx is done or the connection fails, and returns why.
	ListenOutbox(ctx context.Context, notify func()) error
}

// OutboxWaitListener is implemented by listeners whose database notifies
// only while a relay waits, so that producers do not pay for a
// notification on every commit (PostgreSQL from migration 0006: a
// notification takes a lock global to the server until the commit's WAL
// flush).
type OutboxWaitListener interface {
	OutboxListener
	// ListenOutboxWaiting is ListenOutbox for such databases. The relay
	// sends on idle when a claim found nothing and no batch is in flight
	// (once per such stretch: after a poll that found nothing it sends
	// again only if a notification, a batch's end or another wake-up came
	// since);
	// the listener then declares the relay waiting, once every transaction
	// that inserted rows without notifying has ended, and calls notify
	// once more if rows may be waiting to be claimed (it may call it when
	// none are; it must not skip it when some are). It looks again at each
	// later idle while the relay waits: a batch marked since may have freed
	// its aggregates' next rows. From then on inserts notify, until a
	// notification arrives: the listener calls notify and declares the
	// relay busy again (it finds further rows by claiming until a claim
	// finds nothing).
	ListenOutboxWaiting(ctx context.Context, notify func(), idle <-chan struct{}) error
}

// DueAt returns Now, or time.Now() when it is zero.
func (p ClaimParams) DueAt() time.Time {
	if p.Now.IsZero() {
		return time.Now()
	}
	return p.Now
}

// HeadLimit returns the number of heads a claim may take: Limit, or
// MaxHeads when it is positive and smaller.
func (p ClaimParams) HeadLimit() int {
	if p.MaxHeads > 0 && p.MaxHeads < p.Limit {
		return p.MaxHeads
	}
	return p.Limit
}

// OutboxClaimer is implemented by drivers that can claim outbox rows cheaper
// than RelayDialect.ClaimOutbox in a transaction of the relay's: PostgreSQL
// on pgx sends the claim's statements in one pipeline, one round trip. The
// result is the same as ClaimOutbox's, committed.
type OutboxClaimer interface {
	ClaimOutbox(ctx context.Context, p ClaimParams) ([]ClaimedRow, error)
}

// ClaimParams are the parameters of RelayDialect.ClaimOutbox.
type ClaimParams struct {
	// Owner is the lease token written to lease_owner. Use a fresh one per
	// claim.
	Owner uuid.UUID
	// Lease is how long the lease lasts, from the database's clock.
	Lease time.Duration
	// Limit is the maximum number of rows claimed.
	Limit int
	// MaxPerAggregate is the maximum number of rows of one aggregate claimed
	// at once: its head and up to MaxPerAggregate-1 rows after it.
	MaxPerAggregate int
	// Now is the relay's clock: delayed rows whose not_before is at or
	// before it are due, and the claim makes them claimable (it clears
	// their not_before) before it selects. The zero time means time.Now().
	// Every other time of a claim (leases) is the database's.
	Now time.Time
	// MaxHeads, when positive and below Limit, is the maximum number of
	// aggregates claimed at once (their heads); the rest of the batch is
	// filled with the rows that follow them. It leaves aggregates for the
	// relay's other workers.
	MaxHeads int
}

// OutboxRecord is an outbox row as the relay reads it.
type OutboxRecord struct {
	// OutboxRow holds the row's content. Its ID is the event id the relay
	// publishes: idem.EventID(RawID), that is the UUID RawID holds, or the
	// name-based UUID derived from an id that is not a UUID (the message
	// then carries RawID in the header idem.HeaderOriginalID). It is
	// uuid.Nil when RawID cannot become an event id (Unreadable says why).
	OutboxRow
	// Seq is the insertion order; it identifies the row.
	Seq int64
	// RawID is the id column as stored: the writer's id, whatever it is.
	// Statements that find the row by its id use it, never ID.String().
	RawID string
	// RawHeaders is the headers column as stored (on PostgreSQL, the text
	// of the jsonb value).
	RawHeaders []byte
	// CreatedAt is when the inserting transaction started (the column's
	// default).
	CreatedAt time.Time
	// Attempts is the number of attempts that failed on the row itself (the
	// broker refused it, or it could not be read) since it was written or
	// last requeued. Failures of the whole publish call do not count.
	Attempts int
	// Unreadable, when not nil, says why the row cannot become a message: an
	// id that cannot become an event id (idem.EventID: empty, over 64
	// bytes, not UTF-8), headers that are not a JSON object, a timestamp or
	// version of the wrong type. The relay quarantines such a row at once.
	Unreadable error
}

// ClaimedRow is a row returned by ClaimOutbox.
type ClaimedRow struct {
	OutboxRecord
	// TakenOver is true when the row was leased by another worker whose lease
	// had expired.
	TakenOver bool
}

// ReleaseRow is a row given back by ReleaseOutbox.
type ReleaseRow struct {
	// Seq identifies the row.
	Seq int64
	// Error is why publishing failed. Empty means the row was not attempted
	// (a later row of an aggregate whose earlier row failed, or a stop): the
	// attempt count is unchanged and the row is claimable at once.
	Error string
	// Delay is how long the row waits before it can be claimed again. Only
	// used with an Error.
	Delay time.Duration
	// Refused says that the failure was the row's own (the broker refused
	// this message): it counts an attempt. A failure of the whole publish
	// call (the broker away, a timeout) does not. Only used with an Error.
	Refused bool
}

// QuarantineRow is a row set aside by QuarantineOutbox.
type QuarantineRow struct {
	// Seq identifies the row.
	Seq int64
	// Error is why the row is quarantined; it is kept in last_error.
	Error string
}

// QuarantinedRow is a quarantined outbox row, as RelayDialect lists it.
type QuarantinedRow struct {
	OutboxRecord
	// QuarantinedAt is when the row was quarantined.
	QuarantinedAt time.Time
	// LastError is the row's last_error: why it was quarantined.
	LastError string
}

// QuarantineFilter selects quarantined rows. Zero fields match all.
type QuarantineFilter struct {
	// EventName matches the type column exactly.
	EventName string
	// AggregateType and AggregateID match their columns exactly.
	AggregateType, AggregateID string
	// Since keeps rows quarantined at or after it.
	Since time.Time
	// AfterSeq keeps rows with a seq above it: the last seq of the previous
	// page.
	AfterSeq int64
	// Limit is the most rows returned. Zero means QuarantineLimitDefault.
	Limit int
}

// QuarantineLimitDefault is the page size of ListQuarantined when
// QuarantineFilter.Limit is zero.
const QuarantineLimitDefault = 100

// PageLimit returns f.Limit, or QuarantineLimitDefault when it is not
// positive.
func (f QuarantineFilter) PageLimit() int {
	if f.Limit <= 0 {
		return QuarantineLimitDefault
	}
	return f.Limit
}

// Backlog describes the unpublished rows of the outbox.
type Backlog struct {
	// Rows is the number of unpublished rows that are not quarantined
	// (including those that wait behind a quarantined row), and due.
	Rows int64
	// Oldest is the created_at of the unpublished, unquarantined, undelayed
	// row with the lowest seq, or the due time of a delayed row due before
	// it; zero when there is none.
	Oldest time.Time
	// Quarantined is the number of quarantined rows.
	Quarantined int64
	// Scheduled is the number of delayed rows (idem.Event.NotBefore) not
	// due yet, by the database's clock: unpublished, not quarantined, and
	// not counted in Rows. A delayed row that is due counts in Rows, and
	// Oldest is then at most its due time.
	Scheduled int64
	// NextDue is the earliest due time of the Scheduled rows; zero when
	// there is none.
	NextDue time.Time
}

// ReplayFilter selects outbox rows to replay. Zero fields match all.
type ReplayFilter struct {
	// Since and Until bound occurred_at: Since <= occurred_at < Until.
	Since, Until time.Time
	// EventName matches the type column exactly.
	EventName string
	// AggregateType matches the aggregatetype column exactly.
	AggregateType string
}

// UnreadableError says why an outbox row cannot become a message.
type UnreadableError struct {
	// Seq identifies the row.
	Seq int64
	// Problems lists what is wrong, one error per column.
	Problems []error
}

// Error implements error.
func (e *UnreadableError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "idem: outbox row seq %d cannot be published: ", e.Seq)
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(p.Error())
	}
	b.WriteString(" (fix the row with SQL, then re-drive it with \"idem failed retry --relay\", or remove it)")
	return b.String()
}

// Unwrap returns the problems.
func (e *UnreadableError) Unwrap() []error { return e.Problems }

// OutboxArchiver is implemented by the dialects of the databases a CDC
// relay serves (PostgreSQL, MySQL/MariaDB): it reads and purges the outbox's
// archive, the table idem.Tables.OutboxArchive names ("outbox_archive",
// migration 0013: one row per event and outbox table), where the CDC
// relays (relay/cdc, relay/binlog) keep the events they published when their
// archive is on, since they leave no published row in the outbox: they
// delete their rows (or leave them to their writer, unmarked), and WAL
// messages are no row at all. The relays write it; "idem replay" reads it
// besides the outbox's published rows. SQLite has no CDC relay and no
// archive.
type OutboxArchiver interface {
	// ArchiveInfo describes the archive. A database without the archive's
	// table (migration 0013 not applied) gives ArchiveInfo{}, no error.
	ArchiveInfo(ctx context.Context, ex Executor) (ArchiveInfo, error)
	// ArchiveCounts counts the archived events f selects, per event name,
	// leaving out those whose id is also a published row of the outbox
	// (ReplayCounts counts them).
	ArchiveCounts(ctx context.Context, ex Executor, f ReplayFilter) (map[string]int64, error)
	// ArchiveRows returns up to limit of the archived events ArchiveCounts
	// counts with an archive seq above afterSeq, in archive seq order: the
	// order in which the relay published them (each aggregate's in its
	// order). OutboxRecord.Seq is the archive's seq, CreatedAt the event's
	// published_at.
	ArchiveRows(ctx context.Context, ex Executor, f ReplayFilter, afterSeq int64, limit int) ([]OutboxRecord, error)
	// PurgeArchive deletes at most limit archived events published before
	// before, the oldest first, and returns how many.
	PurgeArchive(ctx context.Context, ex Executor, before time.Time, limit int) (int64, error)
}

// ArchiveInfo describes an outbox's archive (OutboxArchiver.ArchiveInfo).
type ArchiveInfo struct {
	// Exists is false when the database has no archive table.
	Exists bool
	// Empty is true when the archive holds no event.
	Empty bool
	// OldestPublished is the published_at of the oldest archived event,
	// and NewestPublished that of the newest: the relay deletes events
	// older than its archive's retention. Zero when Empty.
	OldestPublished, NewestPublished time.Time
	// OldestOccurred is the lowest occurred_at in the archive. Zero when
	// Empty.
	OldestOccurred time.Time
}
