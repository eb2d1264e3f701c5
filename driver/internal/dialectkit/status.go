package dialectkit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/textenc"
)

// StatusSQL are a dialect's statements of driver.StatusReader, which Base
// implements.
type StatusSQL struct {
	// Now selects the database's clock.
	Now string
	// Outbox selects, in one row: the backlog (unpublished, not
	// quarantined, not_before NULL), the created_at of its lowest seq (NULL when none), the
	// quarantined count, and the latest published_at (NULL when none).
	Outbox string
	// Names selects (source, consumer_name) pairs, without duplicates per
	// source: source 0 for processed_event and delivery_attempt, whose
	// names are stored as they are, 1 for failed_message, whose names are
	// encoded (textenc).
	Names string
	// Consumer selects, for one consumer, with the arguments of
	// ConsumerArgs: its latest processed_at (NULL when none), its markers
	// processed after since, its failure-store entries, their earliest
	// first_failed_at (NULL when none), and its delivery_attempt rows.
	Consumer string
	// ConsumerArgs returns Consumer's arguments for a consumer (its name as
	// stored in processed_event and delivery_attempt, and as stored in
	// failed_message) and the start of the window.
	ConsumerArgs func(name, encoded string, since time.Time) []any
	// Time returns a scan destination for a nullable timestamp column,
	// storing the zero time for NULL.
	Time func(*time.Time) any
	// Scheduled is a ScheduledSQL statement on the outbox.
	Scheduled string
	// LogPosition, when set, selects the position a log-reading relay
	// stored for the outbox and when (MySQL: binlog_position); a missing
	// table or row leaves them empty.
	LogPosition string
}

// ReadStatus implements driver.StatusReader.
func (b *Base) ReadStatus(ctx context.Context, ex driver.Executor, p driver.StatusParams) (driver.Status, error) {
	s := &b.spec.Status
	var st driver.Status
	if err := driver.QueryRow(ctx, ex, s.Now, nil, s.Time(&st.Now)); err != nil {
		return st, b.Wrap(err)
	}
	o := &st.Outbox
	err := driver.QueryRow(ctx, ex, s.Outbox, nil, &o.Backlog, s.Time(&o.OldestUnpublished), &o.Quarantined, s.Time(&o.LastPublished))
	switch {
	case err == nil:
		o.Present = true
		sch, err := ReadScheduled(ctx, ex, s.Scheduled, s.Time)
		if err != nil {
			return st, b.Wrap(fmt.Errorf("outbox: delayed rows: %w", err))
		}
		o.Scheduled, o.NextDue = sch.Merge(&o.Backlog, &o.OldestUnpublished)
	case b.IsMissingTable(err):
		// A consumer-only database; the consumer tables are checked below.
	default:
		return st, b.Wrap(fmt.Errorf("outbox: %w", err))
	}
	if o.Present && s.LogPosition != "" {
		err := driver.QueryRow(ctx, ex, s.LogPosition, nil, &o.LogPosition, s.Time(&o.LogPositionAt))
		if err != nil && !errors.Is(err, idem.ErrNotFound) && !b.IsMissingTable(err) {
			return st, b.Wrap(fmt.Errorf("log position: %w", err))
		}
	}

	names := map[string]bool{}
	for _, n := range p.Consumers {
		names[n] = true
	}
	err = driver.QueryRows(ctx, ex, s.Names, nil, func(rows driver.Rows) error {
		var (
			source int
			name   string
		)
		if err := rows.Scan(&source, &name); err != nil {
			return err
		}
		if source == 1 {
			name = textenc.Decode(name)
		}
		names[name] = true
		return nil
	})
	if err != nil {
		return st, b.Wrap(fmt.Errorf("consumer names: %w", err))
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	slices.Sort(sorted)

	since := st.Now.Add(-p.WindowOrDefault())
	st.Consumers = make([]driver.ConsumerStatus, 0, len(sorted))
	for _, name := range sorted {
		c := driver.ConsumerStatus{Name: name}
		err := driver.QueryRow(ctx, ex, s.Consumer, s.ConsumerArgs(name, textenc.Encode(name), since),
			s.Time(&c.LastProcessed), &c.Processed, &c.Parked, s.Time(&c.OldestParked), &c.Retrying)
		if err != nil {
			return st, b.Wrap(fmt.Errorf("consumer %s: %w", name, err))
		}
		st.Consumers = append(st.Consumers, c)
	}
	return st, nil
}

// NullTime returns a scan destination that stores a nullable timestamp
// into t, as an instant in UTC, and the zero time for NULL: for dialects
// whose driver returns time.Time values with their zone (PostgreSQL).
func NullTime(t *time.Time) any { return nullTime{t} }

type nullTime struct{ t *time.Time }

func (n nullTime) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*n.t = time.Time{}
	case time.Time:
		*n.t = v.UTC()
	default:
		return fmt.Errorf("idem: cannot read %T as a timestamp", src)
	}
	return nil
}
