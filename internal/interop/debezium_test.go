package interop_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/kafka"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testlog"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/relay"
	"github.com/idem-go/idem/relay/binlog"
	"github.com/idem-go/idem/relay/logrelay"
)

const (
	topic     = "outbox.event.order"
	eventName = "order.order.placed.v1"
	aggregate = "42"
)

// appliedTable is what the consumer's handler writes, in its transaction,
// once per application: an event applied twice has two rows.
const appliedTable = `CREATE TABLE applied (
    seq         BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    event_id    CHAR(36) NOT NULL,
    original_id VARCHAR(64) NULL,
    aggregateid VARCHAR(64) NOT NULL
)`

// debeziumRecord is the record Debezium's Outbox Event Router makes of an
// outbox row, with the converters of its documentation's example
// (JsonConverter for the key and the value, without schemas;
// SimpleHeaderConverter for the headers) and
// table.fields.additional.placement=type:header:eventType: topic
// outbox.event.<aggregatetype>, key the aggregate id as a JSON string,
// header "id" the row's id as written, header "eventType" its type, value
// the payload column as a JSON string (MySQL's JSON type is text to
// Debezium).
func debeziumRecord(id, aggregateID, eventType, payload string) *kgo.Record {
	key, _ := json.Marshal(aggregateID)
	value, _ := json.Marshal(payload)
	return &kgo.Record{
		Topic: topic,
		Key:   key,
		Value: value,
		Headers: []kgo.RecordHeader{
			{Key: "id", Value: []byte(id)},
			{Key: "eventType", Value: []byte(eventType)},
		},
	}
}

// TestOneRowOneEventWhicheverPublisher: three outbox rows of a MariaDB
// table written by another program, with the ids Debezium's articles use
// (E42), a UUID and an id of 64 bytes, reach one Kafka topic three times
// each, as Debezium's Outbox Event Router publishes them and as idem's
// polling relay and binlog relay do. One consumer applies each row once,
// under the event id idem.EventID gives its id, with the id in
// idem-original-id when it is not a UUID; the other copies are
// duplicates, with the same content; nothing is parked.
func TestOneRowOneEventWhicheverPublisher(t *testing.T) {
	t.Parallel()
	ctx := testsvc.Ctx(t, 2*time.Minute)
	src := testdb.NewMariaDB(t) // the service's database and its outbox
	dst := testdb.NewMariaDB(t) // the consumer's
	dst.Exec(t, appliedTable)

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	cc := kafka.ClientConfig{Brokers: cluster.ListenAddrs(), Logger: testlog.New(t)}

	// The consumer.
	cons, err := inbox.New(dst.Driver, inbox.Config{Name: "stock", Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	cons.Handle(eventName, func(ctx context.Context, tx *sql.Tx, ev idem.Event) error {
		original := sql.NullString{}
		if v, ok := ev.Headers[idem.HeaderOriginalID]; ok {
			original = sql.NullString{String: v, Valid: true}
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO applied (event_id, original_id, aggregateid) VALUES (?, ?, ?)`,
			ev.ID.String(), original, ev.AggregateID)
		return err
	})
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{ClientConfig: cc, Group: cons.Name(), Topics: []string{topic}}, cons.DeliverBatch)
	if err != nil {
		t.Fatal(err)
	}
	testsvc.Start(t, sub)

	pub, err := kafka.NewPublisher(kafka.PublisherConfig{ClientConfig: cc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	producer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(producer.Close)

	// The binlog relay reads the table's inserts from its first start on;
	// it leaves the rows to the polling relay (KeepRows), as a table that
	// Debezium reads is left to its writer.
	bl, err := binlog.New(src.URL, pub, binlog.Config{
		Delete:          logrelay.KeepRows,
		FlushInterval:   20 * time.Millisecond,
		Heartbeat:       time.Second,
		RetryBackoff:    10 * time.Millisecond,
		MaxRetryBackoff: 200 * time.Millisecond,
		Logger:          testlog.New(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	testsvc.Start(t, bl)

	uuidID := idem.NewEventID().String()
	ids := []string{"E42", uuidID, strings.Repeat("E42-", 16)} // the last is 64 bytes
	payload := func(i int) string { return fmt.Sprintf(`{"orderId":"42","line":%d}`, i) }

	// Debezium's copies first on the topic's one partition: the consumer
	// applies those, and must take the relays' copies for their duplicates.
	for i, id := range ids {
		if err := producer.ProduceSync(ctx, debeziumRecord(id, aggregate, eventName, payload(i))).FirstErr(); err != nil {
			t.Fatalf("produce the Debezium record of %q: %v", id, err)
		}
	}
	tx, err := src.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		if _, err := tx.ExecContext(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (?, 'order', ?, ?, ?)`,
			id, aggregate, eventName, payload(i)); err != nil {
			t.Fatalf("insert the row %q: %v", id, err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	poll, err := relay.New(src.Driver, pub, relay.Config{PollInterval: 20 * time.Millisecond, Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	testsvc.Start(t, poll)
	testsvc.WaitFor(t, time.Minute, "the polling relay to publish the rows", func() bool {
		return src.Count(t, "outbox WHERE published_at IS NOT NULL") == len(ids)
	})
	testsvc.WaitFor(t, time.Minute, "the binlog relay to publish the rows", func() bool {
		return bl.Stats().Published >= int64(len(ids))
	})

	// Every copy is on the topic; a record produced now comes after them
	// all, in the same partition and aggregate: once the consumer has
	// handled it, it has handled every copy.
	sentinel := idem.NewEventID()
	if err := producer.ProduceSync(ctx, debeziumRecord(sentinel.String(), aggregate, eventName, `{}`)).FirstErr(); err != nil {
		t.Fatalf("produce the sentinel: %v", err)
	}
	testsvc.WaitFor(t, time.Minute, "the consumer to handle the sentinel", func() bool {
		return dst.Count(t, "processed_event WHERE event_id = ?", sentinel.String())+
			dst.Count(t, "failed_message WHERE event_id = ?", sentinel.String()) > 0
	})

	if n := dst.Count(t, "failed_message"); n != 0 {
		rows, err := dst.DB.QueryContext(ctx, "SELECT COALESCE(event_id, ''), `error` FROM failed_message")
		if err == nil {
			for rows.Next() {
				var id, msg string
				if rows.Scan(&id, &msg) == nil {
					t.Errorf("parked: %s: %s", id, msg)
				}
			}
			_ = rows.Close()
		}
		t.Errorf("%d message(s) parked, want none", n)
	}
	for _, raw := range ids {
		want, err := idem.EventID(raw)
		if err != nil {
			t.Fatal(err)
		}
		wantOriginal := raw
		if raw == uuidID {
			wantOriginal = "" // a UUID is itself: no header
		}
		var n int
		var original sql.NullString
		if err := dst.DB.QueryRowContext(ctx, `SELECT COUNT(*), MAX(original_id) FROM applied WHERE event_id = ? AND aggregateid = ?`,
			want.String(), aggregate).Scan(&n, &original); err != nil {
			t.Fatal(err)
		}
		if n != 1 || original.String != wantOriginal {
			t.Errorf("row %q: applied %d times as %s with %s %q; want once, with %q", raw, n, want, idem.HeaderOriginalID, original.String, wantOriginal)
		}
	}
	if n := dst.Count(t, "applied"); n != len(ids)+1 {
		t.Errorf("%d applications, want %d (each row once, and the sentinel)", n, len(ids)+1)
	}
	// The duplicates came from the other two paths, with the same content
	// (name, aggregate, payload): a copy that decoded to another id would
	// have been applied again, one with other content counted as a
	// conflict.
	if s := cons.Stats(); s.Duplicates < uint64(2*len(ids)) || s.Conflicts != 0 || s.Parked != 0 {
		t.Errorf("consumer stats %+v: want %d duplicates or more, no conflict, nothing parked", s, 2*len(ids))
	}

	// Each copy on the topic, read as the consumer reads it, is the event
	// of its row: three copies of each row, one per path.
	copies := map[uuid.UUID]int{}
	for _, m := range topicMessages(t, ctx, cluster.ListenAddrs(), sentinel) {
		ev, err := idem.Decode(m)
		if err != nil {
			t.Errorf("record %q (headers %v) undecodable: %v", m.Body, m.Headers, err)
			continue
		}
		copies[ev.ID]++
		if raw := ev.Headers[idem.HeaderOriginalID]; raw != "" {
			if want, _ := idem.EventID(raw); want != ev.ID {
				t.Errorf("record %q decoded as %s with %s %q, whose event id is %s", m.Body, ev.ID, idem.HeaderOriginalID, raw, want)
			}
		}
	}
	for _, raw := range ids {
		want, _ := idem.EventID(raw)
		if copies[want] < 3 {
			t.Errorf("row %q: %d copies decoded as %s, want 3 (Debezium, polling relay, binlog relay) or more", raw, copies[want], want)
		}
	}
	if len(copies) != len(ids) {
		t.Errorf("the topic's records before the sentinel decoded to %d event ids, want %d: %v", len(copies), len(ids), copies)
	}
}

// topicMessages reads the topic from its start up to the record whose "id"
// header is until, each record as the Kafka subscriber hands it to the
// consumer.
func topicMessages(t *testing.T, ctx context.Context, brokers []string, until uuid.UUID) []idem.Message {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var out []idem.Message
	for {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("reading %s: %d records read, the sentinel not among them: %v", topic, len(out), err)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
		done := false
		fs.EachRecord(func(r *kgo.Record) {
			headers := make(map[string]string, len(r.Headers))
			for _, h := range r.Headers {
				headers[h.Key] = string(h.Value)
			}
			if headers[idem.HeaderEventID] == until.String() {
				done = true
			}
			if !done {
				out = append(out, idem.Message{Key: r.Key, Headers: headers, Body: r.Value,
					AggregateType: strings.TrimPrefix(r.Topic, kafka.TopicPrefixDefault)})
			}
		})
		if done {
			return out
		}
	}
}
