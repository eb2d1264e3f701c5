package dialectkit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/textenc"
)

// QueryFailed runs a failure-store query and scans its rows. The query
// selects, in this order (each dialect casts them as it needs): id,
// consumer_name, source, event_id (text, NULL when the message was
// undecodable), event_name, message_key, headers (JSON text), body, error,
// errors (JSON text), attempts, first_failed_at, failed_at, aggregate_type,
// aggregate_id, held_by (NULL for none), original_body and
// original_headers (JSON text; both NULL for an entry never edited),
// archived_at (NULL for an entry not archived), actions (JSON text). Text
// values are decoded from the encoding that lets them hold any bytes (the
// dialects' SaveFailed writes it); plain text, as older rows hold, reads
// as it is. timeDest adapts the
// two timestamps to the dialect's representation; nil scans them into
// time.Time directly (and archived_at, which may be NULL, through NullTime).
func QueryFailed(ctx context.Context, ex driver.Executor, query string, args []any, timeDest func(*time.Time) any) ([]idem.FailedMessage, error) {
	custom := timeDest != nil
	if !custom {
		timeDest = func(t *time.Time) any { return t }
	}
	var out []idem.FailedMessage
	err := driver.QueryRows(ctx, ex, query, args, func(rows driver.Rows) error {
		var (
			m               idem.FailedMessage
			eventID         *string
			heldBy          *int64
			headers, errors []byte
			origBody        []byte
			origHeaders     []byte
			actions         []byte
		)
		archived := NullTime(&m.Archived)
		if custom {
			archived = timeDest(&m.Archived)
		}
		if err := rows.Scan(&m.ID, &m.Consumer, &m.Source, &eventID, &m.EventName, &m.Key, &headers, &m.Body,
			&m.Error, &errors, &m.Attempts, timeDest(&m.FirstFailed), timeDest(&m.LastFailed),
			&m.AggregateType, &m.AggregateID, &heldBy, &origBody, &origHeaders, archived, &actions); err != nil {
			return err
		}
		if origBody != nil || origHeaders != nil {
			m.Original = &idem.FailedOriginal{Body: origBody}
			if m.Original.Body == nil {
				m.Original.Body = []byte{}
			}
			if origHeaders != nil {
				var err error
				if m.Original.Headers, err = textenc.DecodeMap(origHeaders); err != nil {
					return fmt.Errorf("idem: failed_message %d: original_headers: %w", m.ID, err)
				}
			}
		}
		if len(actions) > 0 {
			if err := json.Unmarshal(actions, &m.Actions); err != nil {
				return fmt.Errorf("idem: failed_message %d: actions: %w", m.ID, err)
			}
			for i := range m.Actions {
				m.Actions[i].By = textenc.Decode(m.Actions[i].By)
				m.Actions[i].Detail = textenc.Decode(m.Actions[i].Detail)
			}
		}
		if heldBy != nil {
			m.HeldBy = *heldBy
		}
		if m.Body == nil {
			m.Body = []byte{}
		}
		if eventID != nil {
			var err error
			if m.EventID, err = uuid.Parse(*eventID); err != nil {
				return fmt.Errorf("idem: failed_message %d: event_id: %w", m.ID, err)
			}
		}
		var err error
		if m.Headers, err = textenc.DecodeMap(headers); err != nil {
			return fmt.Errorf("idem: failed_message %d: headers: %w", m.ID, err)
		}
		if err := json.Unmarshal(errors, &m.History); err != nil {
			return fmt.Errorf("idem: failed_message %d: errors: %w", m.ID, err)
		}
		for i := range m.History {
			m.History[i].Error = textenc.Decode(m.History[i].Error)
		}
		for _, s := range []*string{&m.Consumer, &m.Source, &m.EventName, &m.Error, &m.AggregateType, &m.AggregateID} {
			*s = textenc.Decode(*s)
		}
		out = append(out, m)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// GetFailed runs QueryFailed for a query selecting one entry and returns
// it, or idem.ErrNotFound.
func GetFailed(ctx context.Context, ex driver.Executor, query string, args []any, timeDest func(*time.Time) any) (idem.FailedMessage, error) {
	list, err := QueryFailed(ctx, ex, query, args, timeDest)
	if err != nil {
		return idem.FailedMessage{}, err
	}
	if len(list) == 0 {
		return idem.FailedMessage{}, idem.ErrNotFound
	}
	return list[0], nil
}

// FindFailed runs a dialect's query for the oldest entry of consumer with
// event id id and body body, as received or as edited (its arguments in
// that order, the consumer encoded as the store keeps text, then body once
// more for the original body) and returns its id, or 0 when there is
// none (driver.Dialect.FindFailed).
func FindFailed(ctx context.Context, ex driver.Executor, query, consumer string, id uuid.UUID, body []byte) (int64, error) {
	if body == nil {
		body = []byte{}
	}
	var found int64
	err := driver.QueryRow(ctx, ex, query, []any{textenc.Encode(consumer), id.String(), body, body}, &found)
	if errors.Is(err, idem.ErrNotFound) {
		return 0, nil
	}
	return found, err
}
