package nats_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/nats"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
)

// benchEvents returns n events over 100 aggregates.
func benchEvents(b *testing.B, n int) []idem.Event {
	b.Helper()
	evs := make([]idem.Event, n)
	for i := range evs {
		var err error
		evs[i], err = idem.NewEvent("order.order.placed.v1", "order", fmt.Sprint(i%100), map[string]int{"i": i})
		if err != nil {
			b.Fatal(err)
		}
	}
	return evs
}

// BenchmarkConsumeBatchPostgres measures events/s from a JetStream stream
// (embedded server over TCP, file storage) into PostgreSQL through the
// subscriber and Consumer.DeliverBatch: deduplication, a handler inserting
// one row, batches of 100, 2 workers. The events are published before the
// subscriber starts; the clock runs from its start to the last event
// applied.
//
// Run: IDEM_TEST_SHELL=1 IDEM_TEST_CMD='go test -run XXX -bench BenchmarkConsumeBatchPostgres -benchtime 1x -count 5 ./broker/nats/' bash scripts/test.sh
func BenchmarkConsumeBatchPostgres(b *testing.B) {
	const n = 20000
	srv := startServer(b)
	pg := testdb.NewPostgres(b, testdb.Options{MaxConns: 10})
	pg.Exec(b, `CREATE TABLE effect (event_id uuid PRIMARY KEY, order_id text NOT NULL)`)
	ctx := context.Background()
	for b.Loop() {
		names := newNames()
		pub := newPublisher(b, srv.url(), names.stream)
		evs := benchEvents(b, n)
		msgs := make([]idem.Message, n)
		for i, ev := range evs {
			msgs[i], _ = idem.NewMessage(ev)
		}
		if err := pub.Publish(ctx, msgs); err != nil {
			b.Fatal(err)
		}
		c, err := inbox.New[pgx.Tx](pg.Driver, inbox.Config{Name: "bench-" + names.stream.Name, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			b.Fatal(err)
		}
		c.Handle("order.order.placed.v1", func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
			_, err := tx.Exec(ctx, `INSERT INTO effect (event_id, order_id) VALUES ($1, $2)`, ev.ID, ev.AggregateID)
			return err
		})
		sub, err := nats.NewSubscriber(nats.SubscriberConfig{
			ConnConfig: nats.ConnConfig{URL: srv.url()}, Stream: names.stream, Consumer: "bench",
		}, c.DeliverBatch)
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := sub.Start(ctx); err != nil {
			b.Fatal(err)
		}
		for c.Stats().Applied < n {
			time.Sleep(time.Millisecond) // polling the counter; not a wait for a result
		}
		elapsed := time.Since(start)
		if err := sub.Stop(ctx); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(n)/elapsed.Seconds(), "events/s")
	}
}

// BenchmarkRelayVsRawPublish measures, in one run, events/s of (a) raw
// nats.go asynchronous publishing (PublishMsgAsync, then waiting for every
// acknowledgement), (c) Publisher.Publish alone in sequential calls of 100
// messages, and (b) the relay moving committed outbox rows from PostgreSQL
// to JetStream through Publisher (default configuration: 2 workers, claims
// of 1000 rows). Both publish to a fresh file-backed stream
// on an embedded server over TCP; (b)'s clock runs from the relay's start
// to the last row marked published.
//
// Run: IDEM_TEST_SHELL=1 IDEM_TEST_CMD='go test -run XXX -bench BenchmarkRelayVsRawPublish -benchtime 1x -count 5 ./broker/nats/' bash scripts/test.sh
func BenchmarkRelayVsRawPublish(b *testing.B) {
	const n = 20000
	srv := startServer(b)
	ctx := context.Background()
	for b.Loop() {
		// (a) raw nats.go.
		names := newNames()
		pub := newPublisher(b, srv.url(), names.stream) // creates the stream
		nc, err := natsgo.Connect(srv.url())
		if err != nil {
			b.Fatal(err)
		}
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4*4096))
		if err != nil {
			b.Fatal(err)
		}
		evs := benchEvents(b, n)
		raw := make([]*natsgo.Msg, n)
		for i, ev := range evs {
			body, _ := idem.MarshalEnvelope(ev)
			raw[i] = &natsgo.Msg{Subject: names.stream.SubjectPrefix + "." + ev.Name, Data: body,
				Header: natsgo.Header{"Nats-Msg-Id": []string{ev.ID.String()}}}
		}
		start := time.Now()
		futures := make([]jetstream.PubAckFuture, 0, n)
		acked := 0
		waitOldest := func() {
			select {
			case <-futures[acked].Ok():
			case err := <-futures[acked].Err():
				b.Fatal(err)
			}
			acked++
		}
		for _, m := range raw {
			if len(futures)-acked >= 4096 { // the same window as Publisher's
				waitOldest()
			}
			f, err := js.PublishMsgAsync(m)
			if err != nil {
				b.Fatal(err)
			}
			futures = append(futures, f)
		}
		for acked < len(futures) {
			waitOldest()
		}
		rawRate := float64(n) / time.Since(start).Seconds()
		nc.Close()
		_ = pub.Close()

		// (c) Publisher alone, calls of 100 messages, one after the other.
		names = newNames()
		pub = newPublisher(b, srv.url(), names.stream)
		msgs := make([]idem.Message, n)
		for i, ev := range benchEvents(b, n) {
			msgs[i], _ = idem.NewMessage(ev)
		}
		start = time.Now()
		for i := 0; i < n; i += 100 {
			if err := pub.Publish(ctx, msgs[i:i+100]); err != nil {
				b.Fatal(err)
			}
		}
		pubRate := float64(n) / time.Since(start).Seconds()
		_ = pub.Close()

		// (b) relay.
		names = newNames()
		pub = newPublisher(b, srv.url(), names.stream)
		pg := testdb.NewPostgres(b, testdb.Options{MaxConns: 20})
		w := outbox.NewWriter(pg.Driver)
		evs = benchEvents(b, n)
		for i := 0; i < n; i += 1000 {
			if err := w.AddExec(ctx, pg.Driver.Pool(), evs[i:i+1000]...); err != nil {
				b.Fatal(err)
			}
		}
		r, err := relay.New(pg.Driver, pub, relay.Config{StatsInterval: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			b.Fatal(err)
		}
		start = time.Now()
		if err := r.Start(ctx); err != nil {
			b.Fatal(err)
		}
		for r.Stats().Published < n {
			time.Sleep(time.Millisecond) // polling the counter; not a wait for a result
		}
		relayRate := float64(n) / time.Since(start).Seconds()
		if err := r.Stop(ctx); err != nil {
			b.Fatal(err)
		}
		_ = pub.Close()
		b.ReportMetric(rawRate, "raw-events/s")
		b.ReportMetric(pubRate, "publisher100-events/s")
		b.ReportMetric(relayRate, "relay-events/s")
		b.ReportMetric(relayRate/rawRate, "relay/raw")
	}
}
