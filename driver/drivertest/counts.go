package drivertest

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testlog"
	"github.com/idem-go/idem/internal/testsvc"
)

// ConsumerCounts checks driver.ConsumerCounter through
// inbox.Consumer.FailureCounts, which the consumer metrics read: a
// consumer's parked messages (those held behind another included), and its
// events with a failed attempt that are neither applied nor parked.
func ConsumerCounts[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	ctx := testsvc.Ctx(t, time.Minute)
	d := db.Driver.Dialect()
	ex := db.Driver.Pool()
	counts := func(name string) (driver.ConsumerCounts, error) {
		c, err := inbox.New(db.Driver, inbox.Config{Name: name, Logger: testlog.New(t)})
		fatalIf(t, err, "consumer %s", name)
		return c.FailureCounts(ctx)
	}
	if got, err := counts("stock"); err != nil || got != (driver.ConsumerCounts{}) {
		t.Errorf("empty database: %+v, %v; want zeros", got, err)
	}

	// stock: a parked message, one held behind it, an undecodable one
	// (no event id); billing: one.
	first, err := d.SaveFailed(ctx, ex, idem.FailedMessage{Consumer: "stock", EventID: idem.NewEventID(),
		EventName: "order.order.placed.v1", AggregateType: "order", AggregateID: "42", Body: []byte("{}"), Error: "boom", Attempts: 3})
	fatalIf(t, err, "park")
	_, err = d.SaveFailed(ctx, ex, idem.FailedMessage{Consumer: "stock", EventID: idem.NewEventID(),
		EventName: "order.order.cancelled.v1", AggregateType: "order", AggregateID: "42", HeldBy: first, Body: []byte("{}"), Error: "held", Attempts: 1})
	fatalIf(t, err, "park behind")
	_, err = d.SaveFailed(ctx, ex, idem.FailedMessage{Consumer: "stock", Body: []byte("not json"), Error: "undecodable", Attempts: 1})
	fatalIf(t, err, "park undecodable")
	_, err = d.SaveFailed(ctx, ex, idem.FailedMessage{Consumer: "billing", EventID: idem.NewEventID(), Body: []byte("{}"), Error: "boom", Attempts: 1})
	fatalIf(t, err, "park for billing")

	// stock retries three events; one of them was applied since (by
	// another process, which left the attempt row): two wait. billing
	// retries one, which stock applied: it waits all the same.
	ids := []uuid.UUID{idem.NewEventID(), idem.NewEventID(), idem.NewEventID()}
	for _, id := range ids {
		for range 2 {
			_, err := d.RecordAttempt(ctx, ex, "stock", id, "failed")
			fatalIf(t, err, "record attempt")
		}
	}
	_, err = d.RecordAttempt(ctx, ex, "billing", ids[0], "failed")
	fatalIf(t, err, "record attempt for billing")
	_, err = d.MarkProcessed(ctx, ex, "stock", []driver.Mark{{ID: ids[0]}})
	fatalIf(t, err, "mark processed")

	for name, want := range map[string]driver.ConsumerCounts{
		"stock":   {Parked: 3, Retrying: 2},
		"billing": {Parked: 1, Retrying: 1},
		"nobody":  {},
	} {
		if got, err := counts(name); err != nil || got != want {
			t.Errorf("%s: %+v, %v; want %+v", name, got, err, want)
		}
	}

	// Parked, an event's attempts go; removed, its entry goes.
	fatalIf(t, d.ClearAttempts(ctx, ex, "stock", ids[1:2]), "clear attempts")
	_, err = d.DeleteFailed(ctx, ex, first)
	fatalIf(t, err, "remove")
	if got, err := counts("stock"); err != nil || got != (driver.ConsumerCounts{Parked: 2, Retrying: 1}) {
		t.Errorf("stock after a clear and a removal: %+v, %v; want 2 parked, 1 retrying", got, err)
	}
}
