package relaymetrics_test

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
	"github.com/idem-go/idem/relay/relaymetrics"
)

// A running relay feeds the claim, publish and mark histograms and the
// commit-to-publish one through Instrument, and its messages in flight show
// while the broker holds them.
func TestRelayFeedsMetrics(t *testing.T) {
	t.Parallel()
	db := testdb.NewSQLite(t)
	ctx := testsvc.Ctx(t, time.Minute)
	w := outbox.NewWriter(db.Driver)
	const events = 10
	tx, err := db.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range events {
		ev, err := idem.NewEvent("order.order.placed.v1", "order", fmt.Sprint(i), map[string]int{"i": i})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Add(ctx, tx, ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	hold := make(chan struct{})
	pub := memory.New()
	pub.SetFunc(func(call int, _ []idem.Message) memory.Action {
		if call == 1 {
			return memory.Action{Hang: hold}
		}
		return memory.Action{}
	})
	m := relaymetrics.NewWith(relaymetrics.Options{Table: "order"})
	r, err := relay.New(db.Driver, pub, m.Instrument(relay.Config{
		Workers: 1, MaxPerAggregate: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}))
	if err != nil {
		t.Fatal(err)
	}
	m.Watch(r)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	testsvc.Start(t, r)

	// The first Publish call hangs: its 10 messages are in flight.
	testsvc.WaitFor(t, 10*time.Second, "the first publish call", func() bool { return r.Stats().InFlight == events })
	want := `# HELP idem_relay_inflight_publishes Messages handed to the broker whose Publish call has not returned.
# TYPE idem_relay_inflight_publishes gauge
idem_relay_inflight_publishes{table="order"} %d
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(fmt.Sprintf(want, events)), "idem_relay_inflight_publishes"); err != nil {
		t.Error(err)
	}
	close(hold)
	testsvc.WaitFor(t, 10*time.Second, "every row published", func() bool { return r.Stats().Published == events })
	if err := testutil.GatherAndCompare(reg, strings.NewReader(fmt.Sprintf(want, 0)), "idem_relay_inflight_publishes"); err != nil {
		t.Error(err)
	}

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	hist := map[string]*dto.Histogram{}
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			if l := s.GetLabel(); len(l) != 1 || l[0].GetName() != "table" || l[0].GetValue() != "order" {
				t.Errorf("%s: labels %v, want table=order", mf.GetName(), l)
			}
			if h := s.GetHistogram(); h != nil {
				hist[mf.GetName()] = h
			}
		}
	}
	for name, min := range map[string]uint64{
		"idem_relay_claim_duration_seconds":    1,
		"idem_relay_publish_duration_seconds":  1,
		"idem_relay_mark_duration_seconds":     1,
		"idem_relay_commit_to_publish_seconds": events,
	} {
		if n := hist[name].GetSampleCount(); n < min {
			t.Errorf("%s: %d samples, want at least %d", name, n, min)
		}
	}
	// The hung call lasted until it was released: the publish histogram
	// holds at least one long sample.
	if p := hist["idem_relay_publish_duration_seconds"]; p.GetSampleSum() <= 0 {
		t.Errorf("publish durations sum to %v", p.GetSampleSum())
	}
}

// The relays of several outbox tables share a registry: each has its table
// label.
func TestRelaysShareARegistry(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	for i, table := range []string{"order", "shipping", "billing"} {
		m := relaymetrics.NewWith(relaymetrics.Options{Table: table, ConstLabels: prometheus.Labels{"service": "shop"}})
		m.Watch(fixed{Backlog: int64(i)})
		if err := reg.Register(m); err != nil {
			t.Fatalf("register the relay of %s: %v", table, err)
		}
	}
	want := `
# HELP idem_relay_backlog_rows Unpublished outbox rows, quarantined ones excluded.
# TYPE idem_relay_backlog_rows gauge
idem_relay_backlog_rows{service="shop",table="billing"} 2
idem_relay_backlog_rows{service="shop",table="order"} 0
idem_relay_backlog_rows{service="shop",table="shipping"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idem_relay_backlog_rows"); err != nil {
		t.Error(err)
	}
}
