package cdc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-go/idem"
)

// park quarantines a message the broker refused on Config.QuarantineAfter
// attempts: its row gets quarantined_at and last_error, or, for a WAL
// message or a row its writer deleted, a quarantined row is written, where
// "idem failed list|show|retry|remove --relay" find it. A table without
// idem's columns cannot hold it: the message is then logged at error level
// with its whole content, and skipped.
func (r *Relay) park(ctx context.Context, e *entry, reason error) error {
	rec := e.rec
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	lastError := fmt.Sprintf("refused by the broker on %d attempts; last: %v", e.out.Refusals, reason)
	var payload, headers any
	if rec.Payload != nil && idem.IsJSONContentType(rec.ContentType) {
		payload = string(rec.Payload)
	}
	if len(rec.RawHeaders) > 0 {
		headers = string(rec.RawHeaders)
	}
	id := rec.RawID
	if e.wal {
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
				return fmt.Errorf("idem: cdc: quarantine a refused message: headers: %w", err)
			}
			headers = string(b)
		}
	}
	query, args := r.sql.park, []any{id, rec.AggregateType, rec.AggregateID, rec.Type,
		payload, rec.OccurredAt, rec.AggregateVersion, headers, lastError, e.out.Refusals}
	if rec.ContentType != "" {
		// Only then are content_type and payload_binary named: an outbox
		// that predates them parks JSON events as before.
		var bin []byte
		if !idem.IsJSONContentType(rec.ContentType) {
			bin = append([]byte{}, rec.Payload...)
		}
		query, args = r.sql.parkTyped, append(args, rec.ContentType, bin)
	}
	_, err := r.pool.Exec(qctx, query, args...)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42703" { // undefined_column: not idem's table
		r.stats.unreadable.Add(1)
		r.log.Error("the broker refused a message on every attempt, and the outbox has no quarantined_at, last_error and attempts columns to park it in; skipped",
			"id", rec.RawID, "aggregate_type", rec.AggregateType, "aggregate_id", rec.AggregateID, "type", rec.Type,
			"payload", quote(rec.Payload), "headers", quote(rec.RawHeaders), "attempts", e.out.Refusals, "error", reason)
		return nil
	}
	if err != nil {
		return fmt.Errorf("idem: cdc: quarantine a refused message: %w", err)
	}
	r.stats.quarantined.Add(1)
	r.log.Error("quarantined a message the broker refused on every attempt; the later messages of its aggregate go on (idem failed list --relay shows it, idem failed retry --relay publishes it again)",
		"id", rec.RawID, "aggregate_type", rec.AggregateType, "aggregate_id", rec.AggregateID, "type", rec.Type,
		"attempts", e.out.Refusals, "error", reason)
	return nil
}
