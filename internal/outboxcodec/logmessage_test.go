package outboxcodec_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/outboxcodec"
)

// A WAL message written by another program, in SQL, decodes as one
// written by outbox.NewLogWriter: occurred_at as RFC 3339 (PostgreSQL's JSON of a
// timestamptz) or as PostgreSQL's text output (now()::text); the optional
// fields may be left out; what cannot be read is said.
func TestDecodeLogMessage(t *testing.T) {
	t.Parallel()
	id := uuid.New()
	at := time.Date(2026, 12, 3, 16, 15, 0, 123456000, time.UTC)
	row := driver.OutboxRow{ID: id, AggregateType: "order", AggregateID: "42", Type: "order.order.placed.v1",
		Payload: []byte(`{"total":12.5}`), OccurredAt: at, AggregateVersion: 3, Headers: map[string]string{"traceparent": "00-x"}}
	content, err := outboxcodec.EncodeLogMessage(row)
	if err != nil {
		t.Fatal(err)
	}
	rec := outboxcodec.DecodeLogMessage(content)
	if rec.Unreadable != nil || rec.ID != id || rec.AggregateType != "order" || rec.AggregateID != "42" || rec.Type != row.Type ||
		string(rec.Payload) != `{"total":12.5}` || !rec.OccurredAt.Equal(at) || rec.AggregateVersion != 3 || rec.Headers["traceparent"] != "00-x" {
		t.Fatalf("round trip of %s: %+v", content, rec)
	}

	base := `{"id":"` + id.String() + `","aggregatetype":"order","aggregateid":"42","type":"order.order.placed.v1","payload":{"total":12.5}`
	for _, tc := range []struct {
		occurredAt string
		want       time.Time
	}{
		{`"2026-12-03T16:15:00.123456+00:00"`, at}, // to_json(now())
		{`"2026-12-03 16:15:00.123456+00"`, at},    // now()::text
		{`"2026-12-03 21:45:00.123456+05:30"`, at}, // now()::text, another zone
		{`"2026-12-03 16:15:00+00"`, at.Truncate(time.Second)},
		{`"2026-12-03T16:15:00.123456+00"`, at},
	} {
		rec := outboxcodec.DecodeLogMessage([]byte(base + `,"occurred_at":` + tc.occurredAt + `}`))
		if rec.Unreadable != nil || !rec.OccurredAt.Equal(tc.want) {
			t.Errorf("occurred_at %s: %v, unreadable %v; want %v", tc.occurredAt, rec.OccurredAt, rec.Unreadable, tc.want)
		}
	}
	// Debezium's five columns only: the relay fills occurred_at with the
	// commit time.
	if rec := outboxcodec.DecodeLogMessage([]byte(base + `}`)); rec.Unreadable != nil || rec.ID != id || !rec.OccurredAt.IsZero() {
		t.Errorf("five columns: %+v", rec)
	}
	for _, tc := range []struct{ content, problem string }{
		{base + `,"occurred_at":"2026-12-03 16:15:00"}`, "with a time zone"}, // timestamp without time zone
		{base + `,"occurred_at":"yesterday"}`, "RFC 3339"},
		{base + `,"occurred_at":"0000-01-01T00:00:00+01:00"}`, "outside years 0000 to 9999"}, // year -1 in UTC
		{base + `,"occurred_at":"9999-12-31 23:59:59-01"}`, "outside years 0000 to 9999"},    // year 10000 in UTC
		{`{"id":"","type":"t"}`, `id "" is empty`},
		{`{"type":"t"}`, `id "" is empty`},
		{`{"id":"` + strings.Repeat("x", 65) + `","type":"t"}`, `is 65 bytes long, more than 64`},
		{`[1,2]`, "not a JSON object"},
		{base + `,"headers":[1]}`, "not a JSON object"},
		{base + `,"aggregate_version":"3"}`, "not an integer"},
	} {
		rec := outboxcodec.DecodeLogMessage([]byte(tc.content))
		if rec.Unreadable == nil || !strings.Contains(rec.Unreadable.Error(), tc.problem) {
			t.Errorf("%s: unreadable %v, want a problem saying %q", tc.content, rec.Unreadable, tc.problem)
		}
	}
}

// EncodeLogMessage refuses a time RFC 3339 cannot write, rather than write
// a message no relay can read.
func TestEncodeLogMessageYears(t *testing.T) {
	t.Parallel()
	for _, at := range []time.Time{
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(9999, 12, 31, 23, 0, 0, 0, time.FixedZone("", -2*3600)),
		time.Date(-1, 12, 31, 0, 0, 0, 0, time.UTC),
	} {
		if b, err := outboxcodec.EncodeLogMessage(driver.OutboxRow{ID: uuid.New(), OccurredAt: at}); err == nil {
			t.Errorf("occurred_at %v: %s, want an error", at, b)
		}
	}
	for _, at := range []time.Time{{}, time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)} {
		b, err := outboxcodec.EncodeLogMessage(driver.OutboxRow{ID: uuid.New(), OccurredAt: at})
		if err != nil {
			t.Fatalf("occurred_at %v: %v", at, err)
		}
		if rec := outboxcodec.DecodeLogMessage(b); rec.Unreadable != nil || !rec.OccurredAt.Equal(at) {
			t.Errorf("occurred_at %v: decoded %v, %v", at, rec.OccurredAt, rec.Unreadable)
		}
	}
}

// A payload that is not JSON is payload_base64 in the WAL message, with its
// content type, and comes back byte for byte.
func TestLogMessageBinaryPayload(t *testing.T) {
	t.Parallel()
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	row := driver.OutboxRow{ID: uuid.New(), AggregateType: "order", AggregateID: "42", Type: "t",
		Payload: all, OccurredAt: time.Now().UTC(), ContentType: "application/x-protobuf"}
	content, err := outboxcodec.EncodeLogMessage(row)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(content), `"content_type":"application/x-protobuf","payload_base64":"AAECAwQF`) || !strings.Contains(string(content), `"payload":null`) {
		t.Fatalf("content: %s", content)
	}
	rec := outboxcodec.DecodeLogMessage(content)
	if rec.Unreadable != nil || rec.ContentType != row.ContentType || string(rec.Payload) != string(all) {
		t.Fatalf("round trip: %+v", rec)
	}
	msg, err := outboxcodec.Message(rec)
	if err != nil || !strings.Contains(string(msg.Body), `"payload_base64":"AAECAwQF`) {
		t.Fatalf("message: %s %v", msg.Body, err)
	}
	base := `{"id":"` + row.ID.String() + `","aggregatetype":"order","aggregateid":"42","type":"t"`
	for content, want := range map[string]string{
		base + `,"content_type":"application/x-protobuf","payload_base64":"***"}`:               "not a base64 string",
		base + `,"content_type":"application/json","payload_base64":"AA=="}`:                    "JSON content type",
		base + `,"content_type":"application/x-protobuf","payload":{}}`:                         "not JSON",
		base + `,"content_type":"application/x-protobuf","payload":{},"payload_base64":"AA=="}`: "both set",
	} {
		rec := outboxcodec.DecodeLogMessage([]byte(content))
		if rec.Unreadable == nil || !strings.Contains(rec.Unreadable.Error(), want) {
			t.Errorf("%s: %v, want %q", content, rec.Unreadable, want)
		}
	}
}
