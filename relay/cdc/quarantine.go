package cdc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/relay/internal/logengine"
)

// Park quarantines a message the broker refused on Config.QuarantineAfter
// attempts: its row gets quarantined_at and last_error, or, for a WAL
// message or a row its writer deleted, a quarantined row is written. A
// table without idem's columns cannot hold it (false).
func (r *source) Park(ctx context.Context, p logengine.Refused, notify logengine.Notify) (parked bool, err error) {
	err = r.inTx(ctx, notify, func(q pgxQuerier) (int64, error) {
		seq, err := r.park(ctx, q, p)
		parked = seq != 0
		return seq, err
	})
	return parked, err
}

// pgxQuerier is what the quarantine's statements run on: the pool, or the
// transaction of a notice.
type pgxQuerier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// inTx runs fn on the pool, or, with notify, in a transaction that calls
// notify with the seq fn returns (0: nothing quarantined; -1: quarantined
// already, told of then: no notice).
func (r *source) inTx(ctx context.Context, notify logengine.Notify, fn func(pgxQuerier) (int64, error)) error {
	if notify == nil {
		_, err := fn(r.pool)
		return err
	}
	return pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		seq, err := fn(tx)
		if err != nil || seq <= 0 {
			return err
		}
		return notify(ctx, postgres.PgxExecutor{Q: tx}, seq)
	})
}

// park quarantines p on q and returns the seq of its row, 0 when the
// table cannot hold it.
func (r *source) park(ctx context.Context, q pgxQuerier, p logengine.Refused) (int64, error) {
	rec := p.Rec
	lastError := logengine.RefusedError(p)
	if p.Table {
		// A row read from the table: it is there, with its attempts.
		if _, err := q.Exec(ctx, r.sql.quarantineAfter, rec.Seq, lastError, p.Refusals-p.Earlier); err != nil {
			return 0, fmt.Errorf("idem: cdc: quarantine row seq %d: %w", rec.Seq, err)
		}
		return rec.Seq, nil
	}
	var payload, headers any
	if rec.Payload != nil && idem.IsJSONContentType(rec.ContentType) {
		payload = string(rec.Payload)
	}
	if len(rec.RawHeaders) > 0 {
		headers = string(rec.RawHeaders)
	}
	id := rec.RawID
	if p.WAL {
		// A WAL message has no row: the row written holds its event id,
		// which idem's uuid column takes whatever the message's id was,
		// and, for an id derived from one that is not a UUID, that id in
		// its header, so that a re-drive publishes the same message.
		id = rec.ID.String()
		if idem.IsDerivedEventID(rec.RawID) {
			h := make(map[string]string, len(rec.Headers)+1)
			for k, v := range rec.Headers {
				h[k] = v
			}
			h[idem.HeaderOriginalID] = rec.RawID
			b, err := json.Marshal(h)
			if err != nil {
				return 0, fmt.Errorf("idem: cdc: quarantine a refused message: headers: %w", err)
			}
			headers = string(b)
		}
	}
	query, args := r.sql.park, []any{id, rec.AggregateType, rec.AggregateID, rec.Type,
		payload, rec.OccurredAt, rec.AggregateVersion, headers, lastError, p.Refusals}
	if rec.ContentType != "" {
		// Only then are content_type and payload_binary named: an outbox
		// that predates them parks JSON events as before.
		var bin []byte
		if !idem.IsJSONContentType(rec.ContentType) {
			bin = append([]byte{}, rec.Payload...)
		}
		query, args = r.sql.parkTyped, append(args, rec.ContentType, bin)
	}
	var seq int64
	err := q.QueryRow(ctx, query, args...).Scan(&seq)
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe) && pe.Code == "42703": // undefined_column: not idem's table
		return 0, nil
	case errors.Is(err, pgx.ErrNoRows):
		// Its row is quarantined already (a park after a crash): no
		// second notice.
		return -1, nil
	case err != nil:
		return 0, fmt.Errorf("idem: cdc: quarantine a refused message: %w", err)
	}
	return seq, nil
}

// Quarantine quarantines a row that cannot become a message, in place. A
// row the writer deleted meanwhile, or a table without idem's columns,
// cannot be (false). It fails only when the database does.
func (r *source) Quarantine(ctx context.Context, rec *driver.OutboxRecord, reason error, notify logengine.Notify) (bool, error) {
	done := false
	err := r.inTx(ctx, notify, func(q pgxQuerier) (int64, error) {
		tag, err := q.Exec(ctx, r.sql.quarantine, rec.Seq, reason.Error())
		switch {
		case err == nil && tag.RowsAffected() == 1:
			done = true
			return rec.Seq, nil
		case err == nil, permanent(err):
			return 0, nil
		}
		return 0, err
	})
	return done, err
}

// Delete deletes the published rows of ids and, when recs is not empty,
// archives those events in the same statement: deleted and archived
// together, or neither.
func (r *source) Delete(ctx context.Context, ids []string, recs []*driver.OutboxRecord) (deleted, archived int64, err error) {
	if len(recs) == 0 {
		tag, err := r.pool.Exec(ctx, r.sql.deleteRows, ids)
		return tag.RowsAffected(), 0, err
	}
	args := append([]any{ids}, archiveArgs(recs)...)
	err = r.pool.QueryRow(ctx, r.sql.archiveRows, args...).Scan(&deleted, &archived)
	if err != nil && dataError(err) {
		// An event the archive cannot hold: archive the others one by
		// one, then delete the rows.
		if archived, err = r.archiveEach(ctx, recs); err != nil {
			return 0, 0, err
		}
		tag, err := r.pool.Exec(ctx, r.sql.deleteRows, ids)
		return tag.RowsAffected(), archived, err
	}
	return deleted, archived, err
}
