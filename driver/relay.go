package driver

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// RelayDialect is implemented by dialects that support the polling relay
// (package relay). A relay worker claims a batch of outbox rows under a lease
// (an owner token and an expiry), publishes them, then marks them published or
// releases them, both fenced by the owner token: a worker whose lease expired
// and was taken over changes nothing.
//
// Per-aggregate order rests on ClaimOutbox: it only claims an aggregate's head
// (its unpublished row with the lowest seq) and the rows that follow it, so
// two workers never hold rows of one aggregate at the same time. A head whose
// next unpublished row is under an unexpired lease (a row committed late, with
// a lower seq than rows already in flight) is not claimable until they are
// done. Claims on one table must not run concurrently: each must see the
// leases of the previous ones.
type RelayDialect interface {
	// ClaimOutbox leases up to p.Limit unpublished rows and returns them in
	// seq order. It must run in a transaction (ex is the transaction's
	// executor); the lease takes effect when the transaction commits.
	ClaimOutbox(ctx context.Context, ex Executor, p ClaimParams) ([]ClaimedRow, error)
	// MarkPublished sets published_at on the rows of ids still leased by
	// owner, and returns how many it marked. Rows leased by someone else are
	// left alone.
	MarkPublished(ctx context.Context, ex Executor, owner uuid.UUID, ids []uuid.UUID) (int64, error)
	// ReleaseOutbox gives up the lease of rows still leased by owner, and
	// returns how many it released. A row with an Error counts a failed
	// attempt: attempts+1, last_error set, and no worker claims it (nor any
	// later row of its aggregate) before Delay has passed.
	ReleaseOutbox(ctx context.Context, ex Executor, owner uuid.UUID, rows []ReleaseRow) (int64, error)
	// DeletePublished deletes at most limit rows published before before and
	// returns how many.
	DeletePublished(ctx context.Context, ex Executor, before time.Time, limit int) (int64, error)
	// OutboxBacklog reports the unpublished rows.
	OutboxBacklog(ctx context.Context, ex Executor) (Backlog, error)
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
	// MaxHeads, when positive and below Limit, is the maximum number of
	// aggregates claimed at once (their heads); the rest of the batch is
	// filled with the rows that follow them. It leaves aggregates for the
	// relay's other workers.
	MaxHeads int
}

// OutboxRecord is an outbox row as the relay reads it.
type OutboxRecord struct {
	OutboxRow
	// Seq is the insertion order.
	Seq int64
	// CreatedAt is when the inserting transaction started (the column's
	// default).
	CreatedAt time.Time
	// Attempts is the number of failed publish attempts so far.
	Attempts int
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
	ID uuid.UUID
	// Error is why publishing failed. Empty means the row was not attempted
	// (a later row of an aggregate whose earlier row failed, or a stop): the
	// attempt count is unchanged and the row is claimable at once.
	Error string
	// Delay is how long the row waits before it can be claimed again. Only
	// used with an Error.
	Delay time.Duration
}

// Backlog describes the unpublished rows of the outbox.
type Backlog struct {
	// Rows is the number of unpublished rows.
	Rows int64
	// Oldest is the created_at of the unpublished row with the lowest seq;
	// zero when there is none.
	Oldest time.Time
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

// DecodeHeaders decodes the JSON object of an outbox row's headers column.
// String values are taken as they are; other values (written by programs
// other than idem) keep their JSON text.
func DecodeHeaders(raw []byte) (map[string]string, error) {
	if len(raw) == 0 || string(raw) == "{}" || string(raw) == "null" {
		return nil, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, err
	}
	h := make(map[string]string, len(fields))
	for k, v := range fields {
		var s string
		if json.Unmarshal(v, &s) == nil {
			h[k] = s
			continue
		}
		h[k] = string(v)
	}
	return h, nil
}

// ScanOutboxRecord scans one outbox row whose columns are, in order: id
// (text), aggregatetype, aggregateid, type, payload (JSON text or NULL),
// occurred_at, aggregate_version, headers (JSON text), seq, created_at,
// attempts, then the columns of extra. timeDest adapts the two timestamps
// to the dialect's representation; nil scans them into time.Time directly.
func ScanOutboxRecord(rows Rows, r *OutboxRecord, timeDest func(*time.Time) any, extra ...any) error {
	if timeDest == nil {
		timeDest = func(t *time.Time) any { return t }
	}
	var (
		id               string
		payload, headers []byte
	)
	dest := append([]any{&id, &r.AggregateType, &r.AggregateID, &r.Type, &payload, timeDest(&r.OccurredAt),
		&r.AggregateVersion, &headers, &r.Seq, timeDest(&r.CreatedAt), &r.Attempts}, extra...)
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	var err error
	if r.ID, err = uuid.Parse(id); err != nil {
		return fmt.Errorf("idem: outbox row %s: id: %w", id, err)
	}
	if payload != nil {
		r.Payload = payload
	}
	if r.Headers, err = DecodeHeaders(headers); err != nil {
		return fmt.Errorf("idem: outbox row %s: headers: %w", id, err)
	}
	return nil
}
