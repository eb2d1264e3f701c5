package outboxcodec_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/outboxcodec"
)

// columnText is one column's text as logical replication sends it: absent
// (the table has no such column), NULL, or text.
type columnText struct {
	present, null bool
	text          string
}

func text(s string) columnText { return columnText{present: true, text: s} }

var null = columnText{present: true, null: true}

// fullRow is a row of idem's outbox as pgoutput sends its columns' text.
func fullRow(id string) map[string]columnText {
	return map[string]columnText{
		"id":                text(id),
		"aggregatetype":     text("order"),
		"aggregateid":       text("42"),
		"type":              text("order.order.placed.v1"),
		"payload":           text(`{"total": 12.5}`),
		"occurred_at":       text("2026-12-03 16:15:00.123456+00"),
		"aggregate_version": text("3"),
		"headers":           text(`{"traceparent": "00-x"}`),
		"seq":               text("17"),
		"created_at":        text("2026-12-03 21:45:01.5+05:30"),
		"attempts":          text("2"),
	}
}

func decodeColumns(cols map[string]columnText) (driver.OutboxRecord, error) {
	return outboxcodec.DecodeText(func(col string) ([]byte, bool) {
		c, ok := cols[col]
		if !ok || !c.present {
			return nil, false
		}
		if c.null {
			return nil, true
		}
		return []byte(c.text), true
	})
}

// A row given as column texts decodes as the polling relay reads the same
// row: every column, a table with Debezium's five columns only, and the
// problems of a row that cannot become a message.
func TestDecodeText(t *testing.T) {
	t.Parallel()
	id := uuid.New()
	rec, err := decodeColumns(fullRow(id.String()))
	at := time.Date(2026, 12, 3, 16, 15, 0, 123456000, time.UTC)
	if err != nil || rec.Unreadable != nil || rec.ID != id || rec.RawID != id.String() || rec.AggregateType != "order" ||
		rec.AggregateID != "42" || rec.Type != "order.order.placed.v1" || string(rec.Payload) != `{"total": 12.5}` ||
		!rec.OccurredAt.Equal(at) || rec.AggregateVersion != 3 || rec.Headers["traceparent"] != "00-x" || rec.Seq != 17 ||
		!rec.CreatedAt.Equal(time.Date(2026, 12, 3, 16, 15, 1, 500000000, time.UTC)) || rec.Attempts != 2 {
		t.Fatalf("full row: %+v, %v", rec, err)
	}

	debezium := map[string]columnText{"id": text(id.String()), "aggregatetype": text("order"), "aggregateid": text("42"),
		"type": text("OrderCreated"), "payload": null}
	rec, err = decodeColumns(debezium)
	if err != nil || rec.Unreadable != nil || rec.ID != id || rec.Payload != nil || !rec.OccurredAt.IsZero() ||
		rec.AggregateVersion != 0 || rec.Headers != nil || rec.Seq != 0 {
		t.Fatalf("five columns: %+v, %v", rec, err)
	}

	for _, tc := range []struct {
		column  string
		value   columnText
		problem string
	}{
		{"id", text(""), `id "" is empty`},
		{"id", text(strings.Repeat("x", 65)), `is 65 bytes long, more than 64`},
		{"id", text("E\xff"), `id "E\xff" is not valid UTF-8`},
		{"id", text("00000000-0000-0000-0000-000000000000"), `is the nil UUID`},
		{"headers", text(`[1]`), "are not a JSON object"},
		{"aggregate_version", text("three"), "not an integer"},
		{"aggregate_version", null, "NULL is not an integer"},
	} {
		cols := fullRow(id.String())
		cols[tc.column] = tc.value
		rec, err := decodeColumns(cols)
		if err != nil || rec.Unreadable == nil || !strings.Contains(rec.Unreadable.Error(), tc.problem) || rec.Seq != 17 {
			t.Errorf("%s %+v: %+v, %v; want a row unreadable because %q", tc.column, tc.value, rec.Unreadable, err, tc.problem)
		}
	}

	// Text a typed column cannot hold, which the server never sends.
	for _, column := range []string{"seq", "attempts", "occurred_at", "created_at"} {
		cols := fullRow(id.String())
		cols[column] = text("x")
		if _, err := decodeColumns(cols); err == nil || !strings.Contains(err.Error(), column) {
			t.Errorf("%s \"x\": %v, want an error naming the column", column, err)
		}
	}
	var unreadable *driver.UnreadableError
	cols := fullRow("")
	if rec, _ := decodeColumns(cols); !errors.As(rec.Unreadable, &unreadable) || unreadable.Seq != 17 {
		t.Errorf("unreadable %v, want a *driver.UnreadableError of seq 17", rec.Unreadable)
	}
}

// A binary payload comes as the hex text of a bytea (pgoutput), and is the
// record's payload, byte for byte, with its content type.
func TestDecodeTextBinaryPayload(t *testing.T) {
	t.Parallel()
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	cols := fullRow(uuid.NewString())
	cols["payload"], cols["content_type"] = null, text("application/x-protobuf")
	cols["payload_binary"] = text(string(outboxcodec.EncodeBytea(all)))
	rec, err := decodeColumns(cols)
	if err != nil || rec.Unreadable != nil || rec.ContentType != "application/x-protobuf" || string(rec.Payload) != string(all) {
		t.Fatalf("binary row: %+v, %v", rec, err)
	}
	cols["payload_binary"] = text(`\x00f`)
	if _, err := decodeColumns(cols); err == nil || !strings.Contains(err.Error(), "hex") {
		t.Errorf("odd hex: %v", err)
	}
	for _, tc := range []struct {
		payload, ct, bin columnText
		want             string
	}{
		{text(`{}`), text("application/x-protobuf"), text(`\x00`), "both set"},
		{null, text("application/json"), text(`\x00`), "JSON content type"},
		{null, null, text(`\x00`), "JSON content type"},
		{text(`{}`), text("application/x-protobuf"), null, "not JSON"},
	} {
		cols["payload"], cols["content_type"], cols["payload_binary"] = tc.payload, tc.ct, tc.bin
		rec, err := decodeColumns(cols)
		if err != nil || rec.Unreadable == nil || !strings.Contains(rec.Unreadable.Error(), tc.want) {
			t.Errorf("%+v: %v %v, want %q", tc, rec.Unreadable, err, tc.want)
		}
	}
}
