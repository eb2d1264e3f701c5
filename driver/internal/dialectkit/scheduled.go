package dialectkit

import (
	"context"
	"time"

	"github.com/idem-go/idem/driver"
)

// ScheduledSQL returns the statement that reads the delayed rows of outbox
// (not_before set, unpublished, not quarantined) against the clock
// expression now: the count and earliest not_before of those due, then of
// those not due yet. Every part is a range of scheduled_idx (migration
// 0012).
func ScheduledSQL(outbox, now string) string {
	where := ` FROM ` + outbox + ` WHERE published_at IS NULL AND not_before IS NOT NULL AND quarantined_at IS NULL AND not_before `
	return `SELECT
    (SELECT COUNT(*)` + where + `<= ` + now + `),
    (SELECT MIN(not_before)` + where + `<= ` + now + `),
    (SELECT COUNT(*)` + where + `> ` + now + `),
    (SELECT MIN(not_before)` + where + `> ` + now + `)`
}

// Scheduled is what ScheduledSQL reads.
type Scheduled struct {
	// Due counts the delayed rows whose time has come, not published yet
	// (a polling relay clears not_before at its next claim; a CDC relay
	// publishes them at its next scan); DueSince is the earliest of their
	// times.
	Due      int64
	DueSince time.Time
	// Ahead counts the rows not due yet; NextDue is the earliest of their
	// times.
	Ahead   int64
	NextDue time.Time
}

// ReadScheduled runs query, a ScheduledSQL statement; timeDest returns a
// scan destination for a nullable timestamp.
func ReadScheduled(ctx context.Context, ex driver.Executor, query string, timeDest func(*time.Time) any) (Scheduled, error) {
	var s Scheduled
	err := driver.QueryRow(ctx, ex, query, nil, &s.Due, timeDest(&s.DueSince), &s.Ahead, timeDest(&s.NextDue))
	return s, err
}

// Merge counts the due delayed rows among the waiting ones (rows, and
// oldest: a due row has waited since its time) and returns the figures of
// those not due yet.
func (s Scheduled) Merge(rows *int64, oldest *time.Time) (scheduled int64, nextDue time.Time) {
	*rows += s.Due
	if !s.DueSince.IsZero() && (oldest.IsZero() || s.DueSince.Before(*oldest)) {
		*oldest = s.DueSince
	}
	return s.Ahead, s.NextDue
}
