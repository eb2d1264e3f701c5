package nats_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/nats"
	"github.com/idem-go/idem/inbox"
)

// A publisher with CloudEvents set publishes what the NATS binding says, as
// a plain nats.go client reads it.
func TestCloudEventsPublished(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	for _, mode := range []idem.CloudEventsMode{idem.CloudEventsBinary, idem.CloudEventsStructured} {
		n := newNames()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		pub, err := nats.NewPublisher(ctx, nats.PublisherConfig{ConnConfig: nats.ConnConfig{URL: srv.url()}, Stream: n.stream,
			CloudEvents: &idem.CloudEvents{Mode: mode, Source: "https://shop.example.com/order"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pub.Close() })
		msg := brokertest.NewMessage(t, "order.order.placed.v1", "a b", 7) // a subject to percent-encode
		msg.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tenant": "acme"}
		brokertest.Publish(t, pub, msg)
		ev, err := idem.Decode(msg)
		if err != nil {
			t.Fatal(err)
		}
		js, err := jetstream.New(pub.Conn())
		if err != nil {
			t.Fatal(err)
		}
		stream, err := js.Stream(ctx, n.stream.Name)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := stream.GetLastMsgForSubject(ctx, n.stream.SubjectPrefix+".order.order.placed.v1")
		if err != nil {
			t.Fatal(err)
		}
		if raw.Header.Get("Nats-Msg-Id") != msg.EventID.String() || raw.Header.Get("tenant") != "acme" || raw.Header.Get("traceparent") == "" {
			t.Errorf("%s: headers %v: want Nats-Msg-Id and idem's headers as with the envelope", mode, raw.Header)
		}
		if mode == idem.CloudEventsBinary {
			want := map[string]string{
				"ce-specversion": "1.0", "ce-id": msg.EventID.String(), "ce-source": "https://shop.example.com/order",
				"ce-type": msg.EventName, "ce-subject": "a%20b", "ce-aggregatetype": "test", "ce-datacontenttype": "application/json",
				"ce-time": ev.OccurredAt.Format(idem.OccurredAtLayout), "ce-traceparent": msg.Headers["traceparent"],
			}
			for k, v := range want {
				if got := raw.Header.Get(k); got != v {
					t.Errorf("binary: header %s = %q, want %q", k, got, v)
				}
			}
			if raw.Header.Get("Content-Type") != "" || string(raw.Data) != string(ev.Payload) {
				t.Errorf("binary: data %s, Content-Type %q: want the payload and no Content-Type", raw.Data, raw.Header.Get("Content-Type"))
			}
			continue
		}
		if raw.Header.Get("Content-Type") != idem.ContentTypeCloudEventsJSON {
			t.Errorf("structured: Content-Type %q", raw.Header.Get("Content-Type"))
		}
		for k := range raw.Header {
			if strings.HasPrefix(k, "ce-") {
				t.Errorf("structured: attribute header %s", k)
			}
		}
		var obj map[string]any
		if err := json.Unmarshal(raw.Data, &obj); err != nil {
			t.Fatalf("structured: data %s: %v", raw.Data, err)
		}
		if obj["specversion"] != "1.0" || obj["id"] != msg.EventID.String() || obj["type"] != msg.EventName || obj["subject"] != "a b" || obj["data"] == nil {
			t.Errorf("structured: data %s", raw.Data)
		}
	}
}

// CloudEvents published with nats.go by a program that knows nothing of
// idem are applied once each; one without source is parked.
func TestCloudEventsFromThirdParty(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := brokertest.EffectConsumer(t, b.pg.Driver, inbox.Config{Name: "stock", Retry: fastRetry}, nil)
	b.subscribe(t, "stock", c.DeliverBatch, func(c *nats.SubscriberConfig) { c.Workers = 1 })
	nc, err := natsgo.Connect(b.srv.url())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	brokertest.CloudEventsFromThirdParty(t, b.pg, "stock", func(m brokertest.ThirdPartyCloudEvent) {
		out := natsgo.NewMsg(b.names.stream.SubjectPrefix + ".com.example.order.placed")
		for k, v := range m.Attributes {
			out.Header.Set("ce-"+k, url.PathEscape(v))
		}
		if m.ContentType != "" {
			out.Header.Set("Content-Type", m.ContentType)
		}
		out.Data = m.Body
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := js.PublishMsg(ctx, out); err != nil {
			t.Fatal(err)
		}
	})
}

// The URL parameters cloudevents and cloudevents_source turn CloudEvents on,
// and are not given to nats.go.
func TestCloudEventsURL(t *testing.T) {
	uc, err := nats.ParseURL("nats://h:4222?stream=S&cloudevents=structured&cloudevents_source=%2Fshop%2Forder")
	if err != nil {
		t.Fatal(err)
	}
	want := idem.CloudEvents{Mode: idem.CloudEventsStructured, Source: "/shop/order"}
	if uc.CloudEvents == nil || *uc.CloudEvents != want || uc.PublisherConfig().CloudEvents != uc.CloudEvents || strings.Contains(uc.URL, "cloudevents") {
		t.Errorf("ParseURL: CloudEvents %+v, URL %q", uc.CloudEvents, uc.URL)
	}
	if _, err := nats.ParseURL("nats://h:4222?cloudevents=json"); err == nil || !strings.Contains(err.Error(), "cloudevents=") {
		t.Errorf("cloudevents=json: %v", err)
	}
}

// A binary CloudEvent another program published, without idem's key
// header, is ordered by its subject; the key header wins when set.
func TestCloudEventsOrderKey(t *testing.T) {
	for _, c := range []struct {
		h    natsgo.Header
		want string
	}{
		{natsgo.Header{"ce-subject": {"42"}}, "42"},
		{natsgo.Header{nats.HeaderKey: {"k"}, "ce-subject": {"42"}}, "k"},
		{natsgo.Header{}, ""},
	} {
		if got := nats.OrderKey(c.h); got != c.want {
			t.Errorf("OrderKey(%v) = %q, want %q", c.h, got, c.want)
		}
	}
}

// A payload that is not JSON is a binary-mode message's data as it is, with
// its content type in ce-datacontenttype, and a subscriber gives the same
// bytes back.
func TestCloudEventsBinaryPayload(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	n := newNames()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pub, err := nats.NewPublisher(ctx, nats.PublisherConfig{ConnConfig: nats.ConnConfig{URL: srv.url()}, Stream: n.stream,
		CloudEvents: &idem.CloudEvents{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	msg := brokertest.BinaryPayloadMessage(t, "order.order.placed.v1", "42")
	brokertest.Publish(t, pub, msg)
	js, err := jetstream.New(pub.Conn())
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, n.stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := stream.GetLastMsgForSubject(ctx, n.stream.SubjectPrefix+".order.order.placed.v1")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(raw.Data, brokertest.AllBytes()) || raw.Header.Get("ce-datacontenttype") != brokertest.ContentTypeProtobuf {
		t.Errorf("data %x, ce-datacontenttype %q: want the raw bytes and their type", raw.Data, raw.Header.Get("ce-datacontenttype"))
	}
	var got brokertest.Received
	subscribe(t, srv.url(), n.stream, "bin", got.Deliver)
	brokertest.CheckBinaryPayload(t, msg, got.Wait(t, msg.EventID))
}
