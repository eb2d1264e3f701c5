package drivertest

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/testsvc"
)

// FaultExecutor wraps an executor so that the results of its queries break
// in the middle: after After rows, Next reports false and Err returns Err,
// while Close returns nil, exactly as database/sql's Rows do after a
// connection fails in the middle of a result. Exec is not changed.
type FaultExecutor struct {
	driver.Executor
	// After is the number of rows a result yields before it breaks.
	After int
	// Err is the error the broken results report.
	Err error

	cut atomic.Int32
}

// Query implements driver.Executor.
func (f *FaultExecutor) Query(ctx context.Context, sql string, args ...any) (driver.Rows, error) {
	rows, err := f.Executor.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return &faultRows{Rows: rows, f: f}, nil
}

// Cut returns the number of results that broke.
func (f *FaultExecutor) Cut() int { return int(f.cut.Load()) }

type faultRows struct {
	driver.Rows
	f    *FaultExecutor
	read int
	err  error
}

func (r *faultRows) Next() bool {
	if r.err != nil {
		return false
	}
	if r.read >= r.f.After {
		r.err = r.f.Err
		r.f.cut.Add(1)
		return false
	}
	if !r.Rows.Next() {
		return false
	}
	r.read++
	return true
}

func (r *faultRows) Err() error {
	if r.err != nil {
		return r.err
	}
	return r.Rows.Err()
}

// Close closes the underlying rows and, like database/sql after a broken
// result, returns nil.
func (r *faultRows) Close() error {
	_ = r.Rows.Close()
	return nil
}

// errBroken is the error the broken results report.
var errBroken = errors.New("drivertest: result broken in the middle (injected)")

// ResultErrors checks that an error in the middle of a result reaches the
// caller of every operation that reads rows, instead of a shorter result:
// ListFailed, GetFailed, FindFailed, ProcessedHashes, ParkedAggregates,
// HasParkedAggregates, MarkProcessed of many ids, and the relay's
// ReplayRows, ReplayCounts and ClaimOutbox. Each result has three rows and
// breaks after 0, 1 and 2 of them.
func ResultErrors[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	ctx := testsvc.Ctx(t, 2*time.Minute)
	d := db.Driver.Dialect()
	rd := db.Driver.Dialect()
	pool := db.Driver.Pool()

	// Three of everything.
	var (
		ids  []uuid.UUID
		aggs []idem.AggregateRef
	)
	marks := make([]driver.Mark, 3)
	for i := range marks {
		marks[i] = driver.Mark{ID: idem.NewEventID(), Hash: int64(i + 1)}
		ids = append(ids, marks[i].ID)
		agg := idem.AggregateRef{Type: "order", ID: fmt.Sprint(i)}
		aggs = append(aggs, agg)
		_, err := d.SaveFailed(ctx, pool, idem.FailedMessage{Consumer: "stock", EventID: idem.NewEventID(),
			AggregateType: agg.Type, AggregateID: agg.ID, Body: []byte("x"), Error: "boom", Attempts: 1})
		fatalIf(t, err, "save failed")
	}
	_, err := d.MarkProcessed(ctx, pool, "stock", marks)
	fatalIf(t, err, "mark")
	var published []idem.Event
	for i := range 3 {
		ev, err := idem.NewEvent(fmt.Sprintf("order.order.e%d.v1", i), "order", fmt.Sprint("p", i), map[string]int{"i": i})
		fatalIf(t, err, "event")
		published = append(published, ev)
	}
	insert(t, db, published...)
	owner := uuid.New()
	claimedRows := claim(t, db, rd, owner, time.Minute, 10, 10)
	if len(claimedRows) != 3 {
		t.Fatalf("claimed %d rows to publish, want 3", len(claimedRows))
	}
	_, err = rd.MarkPublished(ctx, pool, owner, claimedSeqs(claimedRows))
	fatalIf(t, err, "mark published")
	insert(t, db, changed(t, "a", 1), changed(t, "b", 1), changed(t, "c", 1))

	list, err := d.ListFailed(ctx, pool, idem.FailedFilter{Limit: 1})
	if err != nil || len(list) != 1 {
		t.Fatalf("list = %d entries, %v", len(list), err)
	}
	failedID, failedEvent := list[0].ID, list[0].EventID

	type check struct {
		name string
		// run calls the operation and returns its error and how many items
		// it returned.
		run func(ctx context.Context, ex driver.Executor) (int, error)
	}
	checks := []check{
		{"ListFailed", func(ctx context.Context, ex driver.Executor) (int, error) {
			l, err := d.ListFailed(ctx, ex, idem.FailedFilter{Consumer: "stock", Limit: 10})
			return len(l), err
		}},
		{"GetFailed", func(ctx context.Context, ex driver.Executor) (int, error) {
			m, err := d.GetFailed(ctx, ex, failedID)
			if err == nil && m.ID != failedID {
				return 0, fmt.Errorf("GetFailed(%d) = entry %d", failedID, m.ID)
			}
			return 3, err
		}},
		{"FindFailed", func(ctx context.Context, ex driver.Executor) (int, error) {
			id, err := d.FindFailed(ctx, ex, "stock", failedEvent, []byte("x"))
			if err == nil && id != failedID {
				return 0, fmt.Errorf("FindFailed(%s) = entry %d, want %d", failedEvent, id, failedID)
			}
			return 3, err
		}},
		{"ProcessedHashes", func(ctx context.Context, ex driver.Executor) (int, error) {
			h, err := d.ProcessedHashes(ctx, ex, "stock", ids)
			return len(h), err
		}},
		{"ParkedAggregates", func(ctx context.Context, ex driver.Executor) (int, error) {
			p, err := d.ParkedAggregates(ctx, ex, "stock", aggs)
			return len(p), err
		}},
		{"HasParkedAggregates", func(ctx context.Context, ex driver.Executor) (int, error) {
			ok, err := d.HasParkedAggregates(ctx, ex, "stock")
			if err == nil && !ok {
				return 0, errors.New("HasParkedAggregates = false, want true")
			}
			return 3, err
		}},
		{"MarkProcessedMany", func(ctx context.Context, ex driver.Executor) (int, error) {
			fresh := []driver.Mark{{ID: idem.NewEventID()}, {ID: idem.NewEventID()}, {ID: idem.NewEventID()}}
			inserted, err := d.MarkProcessed(ctx, ex, "stock", fresh)
			n := 0
			for _, ok := range inserted {
				if ok {
					n++
				}
			}
			return n, err
		}},
		{"ReplayRows", func(ctx context.Context, ex driver.Executor) (int, error) {
			rows, err := rd.ReplayRows(ctx, ex, driver.ReplayFilter{}, 0, 10)
			return len(rows), err
		}},
		{"ReplayCounts", func(ctx context.Context, ex driver.Executor) (int, error) {
			counts, err := rd.ReplayCounts(ctx, ex, driver.ReplayFilter{})
			return len(counts), err
		}},
		{"ClaimOutbox", func(ctx context.Context, ex driver.Executor) (int, error) {
			rows, err := rd.ClaimOutbox(ctx, ex, driver.ClaimParams{Owner: uuid.New(), Lease: time.Minute, Limit: 10, MaxPerAggregate: 10})
			return len(rows), err
		}},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			// Every check runs in a transaction rolled back at its end, so
			// that each sees the same rows.
			err := db.inTx(ctx, func(ex driver.Executor) error {
				n, err := c.run(ctx, ex)
				if err != nil || n != 3 {
					return fmt.Errorf("without faults: %d items, %v; want 3", n, err)
				}
				return nil
			})
			fatalIf(t, err, "%s", c.name)
			for after := range 3 {
				err := db.inTx(ctx, func(ex driver.Executor) error {
					fx := &FaultExecutor{Executor: ex, After: after, Err: errBroken}
					n, err := c.run(ctx, fx)
					switch {
					case fx.Cut() > 0 && !errors.Is(err, errBroken):
						return fmt.Errorf("a result broken after %d rows gave %d items and error %v, want the injected error", after, n, err)
					case fx.Cut() == 0 && (err != nil || n != 3):
						// The operation read no result (MySQL's
						// MarkProcessed only inserts): it must succeed.
						return fmt.Errorf("without a broken result: %d items, %v; want 3", n, err)
					}
					return nil
				})
				if err != nil {
					t.Error(err)
				}
			}
		})
	}
}
