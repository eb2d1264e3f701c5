package nats_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/nats"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
)

func TestPublishHeadersAndSubject(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	n := newNames()
	pub := newPublisher(t, srv.url(), n.stream)
	m := brokertest.NewMessage(t, "order.order.placed.v1", "42", 0)
	m.Headers = map[string]string{"traceparent": "00-abc-def-01"}
	brokertest.Publish(t, pub, m)

	js, err := jetstream.New(pub.Conn())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := js.Stream(ctx, n.stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := stream.GetLastMsgForSubject(ctx, n.stream.SubjectPrefix+".order.order.placed.v1")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"Nats-Msg-Id":            m.EventID.String(),
		idem.HeaderEventID:       m.EventID.String(),
		idem.HeaderEventType:     "order.order.placed.v1",
		nats.HeaderKey:           "42",
		nats.HeaderAggregateType: "test",
		"traceparent":            "00-abc-def-01",
	}
	for k, v := range want {
		if got := raw.Header.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if !bytes.Equal(raw.Data, m.Body) {
		t.Errorf("body = %s, want %s", raw.Data, m.Body)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Duplicates != nats.DuplicatesDefault || info.Config.Storage != jetstream.FileStorage {
		t.Errorf("stream config: duplicates %v storage %v", info.Config.Duplicates, info.Config.Storage)
	}
}

func TestPublishReportsEachMessage(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	n := newNames()
	pub := newPublisher(t, srv.url(), n.stream)
	good := brokertest.NewMessage(t, "order.order.placed.v1", "1", 0)
	spaced := brokertest.NewMessage(t, "order.order.placed.v1", "2", 0)
	spaced.EventName = "order order placed"
	wild := brokertest.NewMessage(t, "order.order.placed.v1", "3", 0)
	wild.EventName = "order.*.placed.v1"
	empty := brokertest.NewMessage(t, "order.order.placed.v1", "4", 0)
	empty.EventName = "order..placed"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := pub.Publish(ctx, []idem.Message{good, spaced, wild, empty})
	errs := broker.Results(err, 4)
	if errs[0] != nil {
		t.Errorf("good message: %v", errs[0])
	}
	for i, want := range []string{"whitespace", "wildcard", "empty token"} {
		if errs[i+1] == nil || !strings.Contains(errs[i+1].Error(), want) {
			t.Errorf("message %d: error %v, want one mentioning %q", i+1, errs[i+1], want)
		}
	}

	// No stream captures other subjects: unroutable.
	other := newNames()
	p2, err := nats.NewPublisher(ctx, nats.PublisherConfig{
		ConnConfig: nats.ConnConfig{URL: srv.url()}, Stream: other.stream, NoDeclare: true, AckTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	err = p2.Publish(ctx, []idem.Message{good})
	if !errors.Is(err, broker.ErrUnroutable) {
		t.Errorf("publish with no stream: %v, want ErrUnroutable", err)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	deliver := func(context.Context, []inbox.Delivery) ([]inbox.Disposition, []error) { return nil, nil }
	cases := []struct {
		cfg  nats.SubscriberConfig
		want string
	}{
		{nats.SubscriberConfig{Consumer: "stock"}, "URL is required"},
		{nats.SubscriberConfig{ConnConfig: nats.ConnConfig{URL: "nats://x"}}, "Consumer"},
		{nats.SubscriberConfig{ConnConfig: nats.ConnConfig{URL: "nats://x"}, Consumer: "stock.v1"}, "dots"},
		{nats.SubscriberConfig{ConnConfig: nats.ConnConfig{URL: "nats://x"}, Consumer: "stock", Bindings: []string{"order.>.x"}}, "Bindings"},
		{nats.SubscriberConfig{ConnConfig: nats.ConnConfig{URL: "nats://x"}, Consumer: "stock", MaxDeliver: -2}, "MaxDeliver"},
	}
	for _, c := range cases {
		_, err := nats.NewSubscriber(c.cfg, deliver)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one mentioning %q", c.cfg, err, c.want)
		}
	}
	got := nats.SubscriberConfig{Consumer: "stock", Bindings: []string{"order.>", "billing.invoice.*.v1"}}.FilterSubjects()
	want := []string{"events.order.>", "events.billing.invoice.*.v1", "events-retry.stock.>"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("filter subjects %v, want %v", got, want)
	}
}

// redeliverer publishes through Publisher.Redeliver, to one consumer.
type redeliverer struct {
	pub      *nats.Publisher
	consumer string
}

func (r redeliverer) Publish(ctx context.Context, msgs []idem.Message) error {
	return r.pub.Redeliver(ctx, r.consumer, msgs)
}

// TestEndToEndWithRelay commits events to an outbox, lets the relay publish
// them to JetStream and a subscriber apply them: each event once, each
// aggregate's events in commit order. A replay is then dropped by
// JetStream's duplicate window, and a replay that goes around it is skipped
// by the consumer.
func TestEndToEndWithRelay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b.pg.Exec(t, `CREATE TABLE applied (seq bigserial PRIMARY KEY, aggregate_id text NOT NULL, version bigint NOT NULL)`)
	c, err := inbox.New[pgx.Tx](b.pg.Driver, inbox.Config{Name: "stock", Retry: fastRetry})
	if err != nil {
		t.Fatal(err)
	}
	c.Handle("order.order.changed.v1", func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO applied (aggregate_id, version) VALUES ($1, $2)`, ev.AggregateID, ev.AggregateVersion)
		return err
	})
	b.subscribe(t, "stock", c.DeliverBatch, func(cfg *nats.SubscriberConfig) { cfg.Bindings = []string{"order.>"} })

	r, err := relay.New(b.pg.Driver, b.pub, relay.Config{
		PollInterval: 50 * time.Millisecond, RetryBackoff: 10 * time.Millisecond, MaxRetryBackoff: 50 * time.Millisecond,
		StatsInterval: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := r.Stop(ctx); err != nil {
			t.Error(err)
		}
	}()

	const aggregates, versions = 10, 20
	w := outbox.NewWriter(b.pg.Driver)
	for v := 1; v <= versions; v++ {
		tx, err := b.pg.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for a := range aggregates {
			ev, err := idem.NewEvent("order.order.changed.v1", "order", fmt.Sprint(a), map[string]int{"version": v})
			if err != nil {
				t.Fatal(err)
			}
			ev.AggregateVersion = int64(v)
			if err := w.Add(ctx, tx, ev); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	testsvc.WaitFor(t, 30*time.Second, "every event applied", func() bool { return c.Stats().Applied == aggregates*versions })

	rows, err := b.pg.Pool.Query(ctx, `SELECT aggregate_id, version FROM applied ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]int64{}
	for rows.Next() {
		var agg string
		var v int64
		if err := rows.Scan(&agg, &v); err != nil {
			t.Fatal(err)
		}
		if v != last[agg]+1 {
			t.Errorf("aggregate %s: version %d applied after %d", agg, v, last[agg])
		}
		last[agg] = v
	}
	rows.Close()

	// A replay inside the duplicate window: JetStream acknowledges and drops
	// every copy.
	n, err := relay.Replay(ctx, b.pg.Driver, b.pub, relay.ReplayFilter{}, relay.ReplayOptions{})
	if err != nil || n != aggregates*versions {
		t.Fatalf("replay: %d %v", n, err)
	}
	// A replay around it (to the consumer's retry subject): the consumer
	// skips every copy.
	if _, err := relay.Replay(ctx, b.pg.Driver, redeliverer{b.pub, "stock"}, relay.ReplayFilter{}, relay.ReplayOptions{}); err != nil {
		t.Fatal(err)
	}
	testsvc.WaitFor(t, 30*time.Second, "every copy skipped", func() bool { return c.Stats().Duplicates == aggregates*versions })
	if s := c.Stats(); s.Applied != aggregates*versions {
		t.Errorf("applied %d, want %d (the first replay must have been dropped by JetStream)", s.Applied, aggregates*versions)
	}
	if got := b.pg.Count(t, "applied"); got != aggregates*versions {
		t.Errorf("effects: %d, want %d", got, aggregates*versions)
	}
}
