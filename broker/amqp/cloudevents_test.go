package amqp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testsvc"
)

// A publisher with CloudEvents set publishes what the AMQP binding says, as
// a client that knows nothing of idem reads it.
func TestCloudEventsPublished(t *testing.T) {
	t.Parallel()
	url := testamqp.URL(t)
	for _, mode := range []idem.CloudEventsMode{idem.CloudEventsBinary, idem.CloudEventsStructured} {
		exchange := testamqp.Name("idem_ce_")
		p, err := amqp.NewPublisher(amqp.PublisherConfig{ConnConfig: amqp.ConnConfig{URL: url}, Exchange: exchange,
			CloudEvents: &idem.CloudEvents{Mode: mode, Source: "/shop/order"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		q := exchange + ".events"
		declare(t, url, exchange, []string{q}, []string{"#"})
		msg := brokertest.NewMessage(t, "order.order.placed.v1", "42", 7)
		msg.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tenant": "acme"}
		brokertest.Publish(t, p, msg)
		ev, err := idem.Decode(msg)
		if err != nil {
			t.Fatal(err)
		}
		withChannel(t, url, func(ch *amqp091.Channel) {
			var got amqp091.Delivery
			testsvc.WaitFor(t, 10*time.Second, "the message in the queue", func() bool {
				d, ok, err := ch.Get(q, true)
				if err != nil {
					t.Fatal(err)
				}
				got = d
				return ok
			})
			if got.MessageId != msg.EventID.String() || got.Type != msg.EventName || got.RoutingKey != msg.EventName || got.DeliveryMode != amqp091.Persistent {
				t.Errorf("%s: properties id %q type %q key %q mode %d", mode, got.MessageId, got.Type, got.RoutingKey, got.DeliveryMode)
			}
			if got.Headers["tenant"] != "acme" || got.Headers["traceparent"] == nil {
				t.Errorf("%s: idem's headers not carried as they are: %v", mode, got.Headers)
			}
			if mode == idem.CloudEventsBinary {
				want := map[string]string{
					"cloudEvents_specversion": "1.0", "cloudEvents_id": msg.EventID.String(), "cloudEvents_source": "/shop/order",
					"cloudEvents_type": msg.EventName, "cloudEvents_subject": "42", "cloudEvents_aggregatetype": ev.AggregateType,
					"cloudEvents_time":        ev.OccurredAt.Format(idem.OccurredAtLayout),
					"cloudEvents_traceparent": msg.Headers["traceparent"],
				}
				for k, v := range want {
					if got.Headers[k] != v {
						t.Errorf("binary: header %s = %v, want %q", k, got.Headers[k], v)
					}
				}
				if _, ok := got.Headers["cloudEvents_datacontenttype"]; ok || got.ContentType != "application/json" {
					t.Errorf("binary: datacontenttype must be the content-type property only: %q, headers %v", got.ContentType, got.Headers)
				}
				if string(got.Body) != string(ev.Payload) {
					t.Errorf("binary: body %s, want the payload %s", got.Body, ev.Payload)
				}
				return
			}
			if got.ContentType != idem.ContentTypeCloudEventsJSON {
				t.Errorf("structured: content type %q", got.ContentType)
			}
			var obj map[string]any
			if err := json.Unmarshal(got.Body, &obj); err != nil {
				t.Fatalf("structured: body %s: %v", got.Body, err)
			}
			if obj["specversion"] != "1.0" || obj["id"] != msg.EventID.String() || obj["source"] != "/shop/order" || obj["type"] != msg.EventName ||
				obj["subject"] != "42" || obj["datacontenttype"] != "application/json" || obj["data"] == nil || obj["traceparent"] == nil {
				t.Errorf("structured: body %s", got.Body)
			}
		})
	}
}

// CloudEvents published with amqp091-go by a program that knows nothing of
// idem are applied once each; one without source is parked.
func TestCloudEventsFromThirdParty(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.consumer(t, nil)
	b.subscribe(t, c.DeliverBatch, func(c *amqp.SubscriberConfig) { c.Workers = 1 })
	conn, err := amqp091.Dial(b.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	brokertest.CloudEventsFromThirdParty(t, b.pg, "stock", func(m brokertest.ThirdPartyCloudEvent) {
		headers := amqp091.Table{}
		ct := m.ContentType
		for k, v := range m.Attributes {
			if k == "datacontenttype" {
				ct = v // the binding's content-type property
				continue
			}
			headers["cloudEvents_"+k] = v
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, b.exchange, "com.example.order.placed", true, false,
			amqp091.Publishing{Headers: headers, ContentType: ct, DeliveryMode: amqp091.Persistent, Body: m.Body})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			t.Fatalf("publish not confirmed: %v %v", ok, err)
		}
	})
}

// The URL parameters cloudevents and cloudevents_source turn CloudEvents on,
// and are not given to amqp091-go.
func TestCloudEventsURL(t *testing.T) {
	uc, err := amqp.ParseURL("amqp://u:p@h:5672/vh?heartbeat=5&cloudevents=structured&cloudevents_source=%2Fshop%2Forder")
	if err != nil {
		t.Fatal(err)
	}
	want := idem.CloudEvents{Mode: idem.CloudEventsStructured, Source: "/shop/order"}
	if uc.CloudEvents == nil || *uc.CloudEvents != want || uc.PublisherConfig().CloudEvents != uc.CloudEvents || uc.URL != "amqp://u:p@h:5672/vh?heartbeat=5" {
		t.Errorf("ParseURL: CloudEvents %+v, URL %q", uc.CloudEvents, uc.URL)
	}
	if _, err := amqp.ParseURL("amqp://u:p@h/?cloudevents=json"); err == nil || !strings.Contains(err.Error(), "cloudevents=") {
		t.Errorf("cloudevents=json: %v", err)
	}
}

// A payload that is not JSON is a binary-mode message's body as it is, with
// its content type in the content-type property, and a subscriber gives
// the same bytes back.
func TestCloudEventsBinaryPayload(t *testing.T) {
	t.Parallel()
	url := testamqp.URL(t)
	exchange := testamqp.Name("idem_ce_")
	p, err := amqp.NewPublisher(amqp.PublisherConfig{ConnConfig: amqp.ConnConfig{URL: url}, Exchange: exchange,
		CloudEvents: &idem.CloudEvents{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	raw, subscribed := exchange+".raw", exchange+".events"
	declare(t, url, exchange, []string{raw, subscribed}, []string{"#"})
	msg := brokertest.BinaryPayloadMessage(t, "order.order.placed.v1", "42")
	brokertest.Publish(t, p, msg)
	withChannel(t, url, func(ch *amqp091.Channel) {
		var got amqp091.Delivery
		testsvc.WaitFor(t, 10*time.Second, "the message in the queue", func() bool {
			d, ok, err := ch.Get(raw, true)
			if err != nil {
				t.Fatal(err)
			}
			got = d
			return ok
		})
		if !bytes.Equal(got.Body, brokertest.AllBytes()) || got.ContentType != brokertest.ContentTypeProtobuf {
			t.Errorf("body %x, content-type %q: want the raw bytes and their type", got.Body, got.ContentType)
		}
	})
	var got brokertest.Received
	testsvc.Start(t, newSubscriber(t, subscriberConfig(url, exchange, subscribed, "#"), got.Deliver))
	brokertest.CheckBinaryPayload(t, msg, got.Wait(t, msg.EventID))
}
