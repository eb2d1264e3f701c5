package inboxmetrics_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/inbox/inboxmetrics"
	"github.com/idem-go/idem/internal/testdb"
)

func delivery(t *testing.T, ev idem.Event) inbox.Delivery {
	t.Helper()
	m, err := idem.NewMessage(ev)
	if err != nil {
		t.Fatal(err)
	}
	return inbox.Delivery{Message: m, Source: "stock.events", Attempt: 1}
}

func event(t *testing.T, aggregate string, occurred time.Time) idem.Event {
	t.Helper()
	ev, err := idem.NewEvent("order.order.placed.v1", "order", aggregate, map[string]string{"order_id": aggregate})
	if err != nil {
		t.Fatal(err)
	}
	ev.OccurredAt = occurred
	return ev
}

// gather returns the samples of reg by metric name and the value of the
// outcome label (empty for the others).
func gather(t *testing.T, reg *prometheus.Registry) map[string]*dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.Metric{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" {
					key += "/" + l.GetValue()
				}
			}
			out[key] = m
		}
	}
	return out
}

// Every outcome of DeliverBatch reaches its counter, applied events their
// commit-to-handle delay, every handler run its duration, every call its
// batch size; the parked and retry figures come from the database, and the
// paused gauge follows the consumer's pause.
func TestConsumerMetrics(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	pg.Exec(t, `CREATE TABLE effect (event_id uuid PRIMARY KEY)`)
	m := inboxmetrics.New("stock", inboxmetrics.Options{Refresh: time.Nanosecond})
	c, err := inbox.New(pg.Driver, inbox.Config{
		Name: "stock", Observer: m.Observer(),
		PauseMin: 50 * time.Millisecond, PauseMax: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	m.Watch(c)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)

	var transient, flakyFixed atomic.Bool
	c.Handle("order.order.placed.v1", func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
		switch ev.AggregateID {
		case "bad":
			return idem.Permanent(errors.New("impossible order"))
		case "flaky":
			if !flakyFixed.Load() {
				return errors.New("stock service confused")
			}
		case "slow":
			time.Sleep(30 * time.Millisecond)
		}
		if transient.Load() {
			return idem.Transient(errors.New("warehouse API answers 503"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO effect (event_id) VALUES ($1)`, ev.ID)
		return err
	})
	ctx := context.Background()

	// Three applied in one batch, 2 s after they occurred; one of them
	// sent again (duplicate), an event nobody handles (ignored).
	old := time.Now().Add(-2 * time.Second)
	evs := []idem.Event{event(t, "1", old), event(t, "2", old), event(t, "slow", old)}
	ds := []inbox.Delivery{delivery(t, evs[0]), delivery(t, evs[1]), delivery(t, evs[2])}
	if disps, _ := c.DeliverBatch(ctx, ds); disps[0].Outcome != inbox.Applied {
		t.Fatalf("first batch: %+v", disps[0])
	}
	other, _ := idem.NewEvent("order.order.shipped.v1", "order", "1", map[string]int{})
	c.DeliverBatch(ctx, []inbox.Delivery{delivery(t, evs[0]), delivery(t, other)})

	// Parked: a permanent error, and an undecodable body.
	bad := delivery(t, event(t, "bad", time.Now()))
	junk := inbox.Delivery{Message: idem.Message{Body: []byte("not json"), EventName: "x"}, Source: "stock.events", Attempt: 1}
	c.DeliverBatch(ctx, []inbox.Delivery{bad})
	c.DeliverBatch(ctx, []inbox.Delivery{junk})

	// Retried: a counted failure, and a later event of its aggregate
	// deferred behind it in the same call.
	flaky := event(t, "flaky", time.Now())
	after := event(t, "flaky", time.Now())
	disps, _ := c.DeliverBatch(ctx, []inbox.Delivery{delivery(t, flaky), delivery(t, after)})
	if disps[0].Outcome != inbox.Failed || disps[1].Outcome != inbox.Deferred {
		t.Fatalf("flaky then its follower: %v, %v", disps[0].Outcome, disps[1].Outcome)
	}

	got := gather(t, reg)
	for key, want := range map[string]float64{
		"idem_consumer_deliveries_total/applied":   3,
		"idem_consumer_deliveries_total/duplicate": 1,
		"idem_consumer_deliveries_total/ignored":   1,
		"idem_consumer_deliveries_total/parked":    2,
		"idem_consumer_deliveries_total/retried":   1,
		"idem_consumer_deliveries_total/deferred":  1,
		"idem_consumer_deliveries_total/paused":    0,
		"idem_consumer_parked_messages":            2,
		"idem_consumer_retry_backlog":              1,
		"idem_consumer_paused":                     0,
	} {
		m := got[key]
		if m == nil {
			t.Errorf("%s: missing", key)
			continue
		}
		v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
		if v != want {
			t.Errorf("%s = %v, want %v", key, v, want)
		}
		if l := m.GetLabel(); len(l) == 0 || l[0].GetName() != "consumer" || l[0].GetValue() != "stock" {
			t.Errorf("%s: labels %v, want consumer=stock first", key, l)
		}
	}
	delay := got["idem_consumer_commit_to_handle_seconds"].GetHistogram()
	if delay.GetSampleCount() != 3 || delay.GetSampleSum() < 6 || delay.GetSampleSum() > 60 {
		t.Errorf("commit to handle: %d samples, sum %v s; want the 3 applied events, about 2 s each",
			delay.GetSampleCount(), delay.GetSampleSum())
	}
	// Handlers ran for the 3 applied events, bad, and flaky twice: in its
	// batch's transaction, then alone (not junk: it has no event; not the
	// duplicate; not the deferred one).
	handler := got["idem_consumer_handler_duration_seconds"].GetHistogram()
	if handler.GetSampleCount() != 6 || handler.GetSampleSum() < 0.03 {
		t.Errorf("handler durations: %d samples, sum %v s; want 6, with the slow one's 30 ms", handler.GetSampleCount(), handler.GetSampleSum())
	}
	batch := got["idem_consumer_batch_size"].GetHistogram()
	if batch.GetSampleCount() != 5 || batch.GetSampleSum() != 3+2+1+1+2 {
		t.Errorf("batch sizes: %d calls, %v deliveries; want 5 calls, 9 deliveries", batch.GetSampleCount(), batch.GetSampleSum())
	}

	// Applied on its retry: the retry backlog empties.
	flakyFixed.Store(true)
	if d, _ := c.Deliver(ctx, delivery(t, flaky)); d.Outcome != inbox.Applied {
		t.Fatalf("retry: %v", d.Outcome)
	}
	if v := gather(t, reg)["idem_consumer_retry_backlog"].GetGauge().GetValue(); v != 0 {
		t.Errorf("retry backlog = %v after the retry applied it, want 0", v)
	}

	// A transient failure pauses the consumer: the gauge says so until a
	// delivery succeeds.
	transient.Store(true)
	if d, _ := c.Deliver(ctx, delivery(t, event(t, "3", time.Now()))); d.Outcome != inbox.Paused {
		t.Fatalf("transient failure: %v, want paused", d.Outcome)
	}
	checkPaused(t, m, 1)
	transient.Store(false)
	deadline := time.Now().Add(10 * time.Second)
	for {
		d, _ := c.Deliver(ctx, delivery(t, event(t, "4", time.Now())))
		if d.Outcome == inbox.Applied {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %v after the dependency came back", d.Outcome)
		}
		time.Sleep(10 * time.Millisecond) // the pause's length: a delivery before its end is answered Pause
	}
	checkPaused(t, m, 0)
	if v := gather(t, reg)["idem_consumer_deliveries_total/paused"].GetCounter().GetValue(); v < 1 {
		t.Errorf("paused deliveries = %v, want at least 1", v)
	}
}

func checkPaused(t *testing.T, m *inboxmetrics.Metrics, want int) {
	t.Helper()
	exp := fmt.Sprintf(`# HELP idem_consumer_paused 1 while the consumer is paused because a dependency is away (its database, the network, a downstream service).
# TYPE idem_consumer_paused gauge
idem_consumer_paused{consumer="stock"} %d
`, want)
	if err := testutil.CollectAndCompare(m, strings.NewReader(exp), "idem_consumer_paused"); err != nil {
		t.Error(err)
	}
}
