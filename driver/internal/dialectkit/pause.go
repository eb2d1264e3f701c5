package dialectkit

import (
	"context"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
)

// PauseSQL are a dialect's statements of driver.Pauses, which Base
// implements, on the table of migration 0015.
type PauseSQL struct {
	// Upsert inserts or replaces a pause: kind, name, starts_at, ends_at,
	// reason, paused_by, paused_at (each time as TimeArg makes it, NULL
	// for zero; a NULL paused_at is the database's current time).
	Upsert string
	// Delete deletes a pause: kind, name.
	Delete string
	// List selects kind, name, starts_at, ends_at, reason, paused_by,
	// paused_at of the pauses of one kind and name, sorted by kind and
	// name: kind, kind, name, name (an empty kind or name matches all).
	List string
	// TimeArg turns a time into an argument of Upsert, nil for zero.
	TimeArg func(time.Time) any
	// TimeDest adapts a timestamp column, which may be NULL.
	TimeDest func(*time.Time) any
}

// SetPause implements driver.Pauses.
func (b *Base) SetPause(ctx context.Context, ex driver.Executor, p idem.Pause) error {
	q := &b.spec.Pauses
	_, err := ex.Exec(ctx, q.Upsert, string(p.Kind), p.Name, q.TimeArg(p.From), q.TimeArg(p.Until),
		p.Reason, p.By, q.TimeArg(p.At))
	return b.Wrap(err)
}

// DeletePause implements driver.Pauses.
func (b *Base) DeletePause(ctx context.Context, ex driver.Executor, kind idem.PauseKind, name string) (bool, error) {
	n, err := ex.Exec(ctx, b.spec.Pauses.Delete, string(kind), name)
	return n > 0, b.Wrap(err)
}

// ListPauses implements driver.Pauses.
func (b *Base) ListPauses(ctx context.Context, ex driver.Executor, kind idem.PauseKind, name string) ([]idem.Pause, error) {
	q := &b.spec.Pauses
	var out []idem.Pause
	err := driver.QueryRows(ctx, ex, q.List, []any{string(kind), string(kind), name, name}, func(rows driver.Rows) error {
		var (
			p    idem.Pause
			kind string
		)
		if err := rows.Scan(&kind, &p.Name, q.TimeDest(&p.From), q.TimeDest(&p.Until), &p.Reason, &p.By, q.TimeDest(&p.At)); err != nil {
			return err
		}
		p.Kind = idem.PauseKind(kind)
		out = append(out, p)
		return nil
	})
	if err != nil {
		return nil, b.Wrap(err)
	}
	return out, nil
}
