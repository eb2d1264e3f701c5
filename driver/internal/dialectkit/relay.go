package dialectkit

import (
	"context"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/outboxcodec"
)

// QueryRecords runs a query selecting outbox rows in the columns of
// outboxcodec.ScanRow and returns them: ReplayRows' page. timeDest is
// ScanRow's.
func QueryRecords(ctx context.Context, ex driver.Executor, query string, args []any, timeDest func(*time.Time) any) ([]driver.OutboxRecord, error) {
	var out []driver.OutboxRecord
	err := driver.QueryRows(ctx, ex, query, args, func(rows driver.Rows) error {
		var rec driver.OutboxRecord
		if err := outboxcodec.ScanRow(rows, &rec, timeDest); err != nil {
			return err
		}
		out = append(out, rec)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// QueryQuarantined runs a query selecting quarantined rows, in the columns
// of outboxcodec.ScanRow followed by quarantined_at and last_error (text,
// never NULL), and returns them. timeDest is ScanRow's, and reads
// quarantined_at too.
func QueryQuarantined(ctx context.Context, ex driver.Executor, query string, args []any, timeDest func(*time.Time) any) ([]driver.QuarantinedRow, error) {
	var out []driver.QuarantinedRow
	err := driver.QueryRows(ctx, ex, query, args, func(rows driver.Rows) error {
		var q driver.QuarantinedRow
		at := any(&q.QuarantinedAt)
		if timeDest != nil {
			at = timeDest(&q.QuarantinedAt)
		}
		if err := outboxcodec.ScanRow(rows, &q.OutboxRecord, timeDest, at, &q.LastError); err != nil {
			return err
		}
		out = append(out, q)
		return nil
	})
	return out, err
}

// GetQuarantined runs QueryQuarantined for a query selecting one row and
// returns it, or idem.ErrNotFound.
func GetQuarantined(ctx context.Context, ex driver.Executor, query string, args []any, timeDest func(*time.Time) any) (driver.QuarantinedRow, error) {
	out, err := QueryQuarantined(ctx, ex, query, args, timeDest)
	if err != nil {
		return driver.QuarantinedRow{}, err
	}
	if len(out) == 0 {
		return driver.QuarantinedRow{}, idem.ErrNotFound
	}
	return out[0], nil
}

// QueryCounts runs a query selecting (name, count) rows and returns them
// as a map: ReplayCounts' figures.
func QueryCounts(ctx context.Context, ex driver.Executor, query string, args []any) (map[string]int64, error) {
	out := map[string]int64{}
	err := driver.QueryRows(ctx, ex, query, args, func(rows driver.Rows) error {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			return err
		}
		out[name] = n
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
