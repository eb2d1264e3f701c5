package monitor_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/monitor"
)

// TestSnapshotWithBroker: the database's figures and the broker's, per
// consumer; a consumer the broker does not know has no queue; a broker
// that fails leaves the database's figures and says why.
func TestSnapshotWithBroker(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pg := testdb.NewPostgres(t)
	pg.Exec(t, `INSERT INTO processed_event (consumer_name, event_id) VALUES ('stock', gen_random_uuid()), ('shipping', gen_random_uuid())`)
	pg.Exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at) VALUES (gen_random_uuid(), 'order', '1', 'order.order.placed.v1', '{}', now() - interval '1 minute')`)

	url := testamqp.URL(t)
	prefix := testamqp.Name("idem_t_")
	queue := prefix + ".stock.events"
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = ch.QueueDelete(queue, false, false, false) }()
	for range 2 {
		if err := ch.PublishWithContext(ctx, "", queue, false, false, amqp091.Publishing{Body: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
	}
	pub, err := amqp.NewPublisher(amqp.PublisherConfig{ConnConfig: amqp.ConnConfig{URL: url}, NoDeclare: true,
		QueueOf: func(c string) string { return prefix + "." + c + ".events" }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	src := monitor.New(pg.Driver, monitor.Options{Name: "shop", Broker: pub})
	if src.Name() != "shop" {
		t.Errorf("Name() = %q", src.Name())
	}
	var snap monitor.Snapshot
	// The queue's count follows the publishes shortly.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if snap, err = src.Snapshot(ctx); err != nil {
			t.Fatal(err)
		}
		if q, ok := snap.Queue("stock"); ok && q.Ready == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("queues: %+v, want stock with 2 ready", snap.Queues)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if snap.Database != "shop" || !snap.Outbox.Present || snap.Outbox.Backlog != 1 || snap.OldestUnpublishedAge() < time.Minute {
		t.Errorf("snapshot: %+v, oldest unpublished age %v", snap, snap.OldestUnpublishedAge())
	}
	if time.Since(snap.Taken).Abs() > time.Minute {
		t.Errorf("taken at %v", snap.Taken)
	}
	if snap.Outbox.Table != "outbox" {
		t.Errorf("outbox table %q", snap.Outbox.Table)
	}
	if c, ok := snap.Consumer("shipping"); !ok || c.ProcessedLastMinute != 1 {
		t.Errorf("shipping: %+v %v", c, ok)
	}
	if _, ok := snap.Queue("shipping"); ok || len(snap.Queues) != 1 || snap.BrokerError != "" {
		t.Errorf("queues: %+v (%q), want stock's only", snap.Queues, snap.BrokerError)
	}
	if q, _ := snap.Queue("stock"); q.Queue != queue || q.Unacked != -1 || q.Lag != -1 || q.Consumers != 0 || q.Waiting() != 2 {
		t.Errorf("stock's queue: %+v", q)
	}

	// A broker that fails: the database's figures stay.
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	snap, err = src.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Consumers) != 2 || len(snap.Queues) != 0 || !strings.Contains(snap.BrokerError, "closed") {
		t.Errorf("with a closed broker: consumers %+v, queues %+v, broker error %q", snap.Consumers, snap.Queues, snap.BrokerError)
	}
}

// TestSnapshotMissingTables: a database without idem's tables says to
// migrate.
func TestSnapshotMissingTables(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t, testdb.Options{NoMigrate: true})
	_, err := monitor.New(pg.Driver, monitor.Options{}).Snapshot(context.Background())
	if !errors.Is(err, idem.ErrMissingTable) || !strings.Contains(err.Error(), "idem migrate up") {
		t.Fatalf("Snapshot without tables: %v, want ErrMissingTable", err)
	}
}
