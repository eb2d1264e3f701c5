package brokertest

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
)

// ThirdPartyCloudEvent is a CloudEvent as a program that knows nothing of
// idem publishes it, for CloudEventsFromThirdParty.
type ThirdPartyCloudEvent struct {
	// Attributes are binary mode's attributes, by name: the sender puts
	// each in a header named with its binding's prefix ("ce_id",
	// "cloudEvents_id", "ce-id"). Empty in structured mode.
	Attributes map[string]string
	// ContentType, when set, is the message's content type: the AMQP
	// content-type property, Kafka's header "content-type", NATS's header
	// "Content-Type".
	ContentType string
	// Body is the message body.
	Body []byte
	// Subject is the event's subject (its aggregate id), for a transport
	// that routes or keys by it.
	Subject string
}

// CloudEventsFromThirdParty checks that an idempotent consumer applies
// CloudEvents another program publishes: binary mode with a UUID id and
// with an id that is not a UUID (applied under idem.EventID's derived id),
// each published twice (the second copy a duplicate), structured mode, and
// one without its source attribute, parked with its raw bytes and an error
// naming the attribute. send publishes a message with the transport's own
// client; an EffectConsumer named consumer on pg receives them, in publishing
// order (one worker, one partition), through a subscriber the test started.
// The check waits for a last message, never for time.
func CloudEventsFromThirdParty(t *testing.T, pg *testdb.PG, consumer string, send func(ThirdPartyCloudEvent)) {
	t.Helper()
	binary := func(id, subject, data string, drop ...string) ThirdPartyCloudEvent {
		attrs := map[string]string{
			"specversion": "1.0", "id": id, "source": "/third/party", "type": "com.example.order.placed",
			"subject": subject, "time": "2026-12-02T08:00:00.5Z", "datacontenttype": "application/json",
		}
		for _, a := range drop {
			delete(attrs, a)
		}
		return ThirdPartyCloudEvent{Attributes: attrs, Body: []byte(data), Subject: subject}
	}
	uuidID := uuid.NewString()
	textID := "order-" + uuid.NewString()[:8]
	derived, err := idem.EventID(textID)
	if err != nil {
		t.Fatal(err)
	}
	badID := uuid.NewString()
	structuredID := uuid.NewString()
	last := uuid.NewString()
	structuredBody, _ := json.Marshal(map[string]any{
		"specversion": "1.0", "id": structuredID, "source": "/third/party", "type": "com.example.order.placed",
		"subject": "4", "datacontenttype": "application/json", "data": map[string]int{"n": 4},
	})
	sent := []ThirdPartyCloudEvent{
		binary(uuidID, "1", `{"n":1}`),
		binary(textID, "2", `{"n":2}`),
		binary(uuidID, "1", `{"n":1}`),
		binary(badID, "3", `{"n":3}`, "source"),
		{ContentType: "application/cloudevents+json; charset=utf-8", Body: structuredBody, Subject: "4"},
		binary(textID, "2", `{"n":2}`),
		binary(last, "5", `{"n":5}`),
	}
	for _, m := range sent {
		send(m)
	}
	testsvc.WaitFor(t, 60*time.Second, "the last CloudEvent applied", func() bool {
		return pg.Count(t, "effect WHERE consumer = $1 AND event_id = $2", consumer, last) > 0
	})
	applied := []idem.Message{
		{EventID: uuid.MustParse(uuidID), Key: []byte("1")},
		{EventID: derived, Key: []byte("2")},
		{EventID: uuid.MustParse(structuredID), Key: []byte("4")},
		{EventID: uuid.MustParse(last), Key: []byte("5")},
	}
	CheckOnceInOrder(t, pg, consumer, applied)
	var body []byte
	var eventID, errText, aggregateID string
	var headers map[string]string
	err = pg.Pool.QueryRow(context.Background(),
		`SELECT body, coalesce(event_id::text, ''), error, aggregate_id, headers FROM failed_message WHERE consumer_name = $1`, consumer).
		Scan(&body, &eventID, &errText, &aggregateID, &headers)
	if err != nil {
		t.Fatalf("the CloudEvent without source, in the failure store: %v", err)
	}
	if n := pg.Count(t, "failed_message WHERE consumer_name = $1", consumer); n != 1 {
		t.Errorf("%d messages parked, want 1", n)
	}
	if !bytes.Equal(body, []byte(`{"n":3}`)) || eventID != badID || aggregateID != "3" || !strings.Contains(errText, "source is missing") {
		t.Errorf("parked: body %q, event %s, aggregate %q, error %q; want the raw data, %s, 3, an error naming source", body, eventID, aggregateID, errText, badID)
	}
	found := false
	for k, v := range headers {
		if strings.HasSuffix(strings.ToLower(k), "type") && v == "com.example.order.placed" {
			found = true
		}
	}
	if !found {
		t.Errorf("parked without its attribute headers: %v", headers)
	}
}
