package kafka_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/kafka"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
)

// A publisher with CloudEvents set publishes what the Kafka binding says,
// as a plain franz-go client reads it.
func TestCloudEventsPublished(t *testing.T) {
	t.Parallel()
	const topic = "outbox.event.test" // brokertest.NewMessage's aggregate type
	c := newCluster(t, 1, topic)
	msg := brokertest.NewMessage(t, "order.order.placed.v1", "42", 7)
	msg.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tenant": "acme"}
	ev, err := idem.Decode(msg)
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []idem.CloudEventsMode{idem.CloudEventsBinary, idem.CloudEventsStructured} {
		p := newPublisher(t, c, func(cfg *kafka.PublisherConfig) { cfg.CloudEvents = &idem.CloudEvents{Mode: mode} })
		brokertest.Publish(t, p, msg)
	}
	recs := readAll(t, c, topic, 2)
	for i, r := range recs {
		mode := []string{"binary", "structured"}[i]
		if string(r.Key) != "42" || header(r, "id") != msg.EventID.String() || header(r, "eventType") != msg.EventName ||
			header(r, "tenant") != "acme" || header(r, "traceparent") == "" {
			t.Errorf("%s: key %q, headers %v: want idem's key and headers as with the envelope", mode, r.Key, r.Headers)
		}
		if mode == "binary" {
			want := map[string]string{
				"ce_specversion": "1.0", "ce_id": msg.EventID.String(), "ce_source": "/idem/test", "ce_type": msg.EventName,
				"ce_subject": "42", "ce_aggregatetype": "test", "ce_time": ev.OccurredAt.Format(idem.OccurredAtLayout),
				"ce_traceparent": msg.Headers["traceparent"], "content-type": "application/json",
			}
			for k, v := range want {
				if got := header(r, k); got != v {
					t.Errorf("binary: header %s = %q, want %q", k, got, v)
				}
			}
			if header(r, "ce_datacontenttype") != "" || string(r.Value) != string(ev.Payload) {
				t.Errorf("binary: value %s, headers %v; want the payload, datacontenttype in content-type only", r.Value, r.Headers)
			}
			continue
		}
		if header(r, "content-type") != idem.ContentTypeCloudEventsJSON {
			t.Errorf("structured: content-type %q", header(r, "content-type"))
		}
		for _, h := range r.Headers {
			if strings.HasPrefix(h.Key, "ce_") {
				t.Errorf("structured: attribute header %s", h.Key)
			}
		}
		var obj map[string]any
		if err := json.Unmarshal(r.Value, &obj); err != nil {
			t.Fatalf("structured: value %s: %v", r.Value, err)
		}
		if obj["specversion"] != "1.0" || obj["id"] != msg.EventID.String() || obj["source"] != "/idem/test" || obj["type"] != msg.EventName ||
			obj["subject"] != "42" || obj["aggregatetype"] != "test" || obj["data"] == nil {
			t.Errorf("structured: value %s", r.Value)
		}
	}
	if _, err := kafka.NewPublisher(kafka.PublisherConfig{ClientConfig: kafka.ClientConfig{Brokers: c.ListenAddrs()},
		ValueFormat: kafka.DebeziumPayload, CloudEvents: &idem.CloudEvents{}}); err == nil || !strings.Contains(err.Error(), "CloudEvents") {
		t.Errorf("CloudEvents with DebeziumPayload: %v, want an error naming both", err)
	}
}

// CloudEvents produced with franz-go by a program that knows nothing of
// idem are applied once each; one without source is parked.
func TestCloudEventsFromThirdParty(t *testing.T) {
	t.Parallel()
	const topic = "things"
	c := newCluster(t, 1, topic)
	pg := testdb.NewPostgres(t)
	cons := effectConsumer(t, pg, "stock", inbox.RetryPolicy{}, nil)
	subscribe(t, c, "stock", []string{topic}, cons.DeliverBatch)
	brokertest.CloudEventsFromThirdParty(t, pg, "stock", func(m brokertest.ThirdPartyCloudEvent) {
		r := &kgo.Record{Topic: topic, Key: []byte(m.Subject), Value: m.Body}
		ct := m.ContentType
		for k, v := range m.Attributes {
			if k == "datacontenttype" {
				ct = v
				continue
			}
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: "ce_" + k, Value: []byte(v)})
		}
		if ct != "" {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: "content-type", Value: []byte(ct)})
		}
		produce(t, c.ListenAddrs(), r)
	})
}

// The URL parameters cloudevents and cloudevents_source turn CloudEvents on.
func TestCloudEventsURL(t *testing.T) {
	uc, err := kafka.ParseURL("kafka://h:9092?cloudevents=binary&cloudevents_source=%2Fshop%2Forder")
	if err != nil {
		t.Fatal(err)
	}
	want := idem.CloudEvents{Mode: idem.CloudEventsBinary, Source: "/shop/order"}
	if uc.CloudEvents == nil || *uc.CloudEvents != want || uc.PublisherConfig().CloudEvents != uc.CloudEvents {
		t.Errorf("ParseURL: CloudEvents %+v", uc.CloudEvents)
	}
	if _, err := kafka.ParseURL("kafka://h:9092?cloudevents=json"); err == nil || !strings.Contains(err.Error(), "cloudevents=") {
		t.Errorf("cloudevents=json: %v", err)
	}
}

// End to end in CloudEvents: events written to the outbox, published by the
// relay as structured CloudEvents, consumed by two subscribers of one
// group: every event is applied once, each aggregate in order.
func TestCloudEventsRelayEndToEnd(t *testing.T) {
	t.Parallel()
	const topic = "outbox.event.order"
	c := newCluster(t, 4, topic)
	src, dst := testdb.NewPostgres(t), testdb.NewPostgres(t)
	evs := newEvents(t, 300, 20)
	cons := effectConsumer(t, dst, "e2e", inbox.RetryPolicy{}, nil)
	for range 2 {
		subscribe(t, c, "e2e", []string{topic}, cons.DeliverBatch)
	}
	pub := newPublisher(t, c, func(cfg *kafka.PublisherConfig) {
		cfg.CloudEvents = &idem.CloudEvents{Mode: idem.CloudEventsStructured, Source: "/shop/order"}
	})
	r, err := relay.New(src.Driver, pub, relay.Config{Workers: 2, PollInterval: 50 * time.Millisecond, StatsInterval: -1, Logger: brokertest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	testsvc.Start(t, r)
	w := outbox.NewWriter[pgx.Tx](src.Driver)
	ctx := context.Background()
	for i := 0; i < len(evs); i += 10 {
		tx, err := src.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Add(ctx, tx, evs[i:i+10]...); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	testsvc.WaitFor(t, 90*time.Second, "every event applied", func() bool {
		return dst.Count(t, "effect") >= len(evs)
	})
	checkOnceInOrder(t, dst, "e2e", evs)
	rec := readAll(t, c, topic, 1)[0]
	if header(rec, "content-type") != idem.ContentTypeCloudEventsJSON || !strings.Contains(string(rec.Value), `"source":"/shop/order"`) {
		t.Errorf("the relay published %s with headers %v, want a structured CloudEvent", rec.Value, rec.Headers)
	}
}

// A payload that is not JSON is a binary-mode record's value as it is, with
// its content type, and a subscriber gives the same bytes back.
func TestCloudEventsBinaryPayload(t *testing.T) {
	t.Parallel()
	const topic = "outbox.event.test"
	c := newCluster(t, 1, topic)
	msg := brokertest.BinaryPayloadMessage(t, "order.order.placed.v1", "42")
	p := newPublisher(t, c, func(cfg *kafka.PublisherConfig) { cfg.CloudEvents = &idem.CloudEvents{} })
	brokertest.Publish(t, p, msg)
	r := readAll(t, c, topic, 1)[0]
	if !bytes.Equal(r.Value, brokertest.AllBytes()) || header(r, "content-type") != brokertest.ContentTypeProtobuf {
		t.Errorf("value %x, content-type %q: want the raw bytes and their type", r.Value, header(r, "content-type"))
	}
	var got brokertest.Received
	subscribe(t, c, "bin", []string{topic}, got.Deliver)
	brokertest.CheckBinaryPayload(t, msg, got.Wait(t, msg.EventID))
}
