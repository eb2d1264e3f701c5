package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
)

// orderPlaced is a payload with rules of its own.
type orderPlaced struct {
	OrderID string `json:"orderId"`
	Lines   []line `json:"lines"`
}

type line struct {
	ProductID string `json:"productId"`
	Quantity  int    `json:"quantity"`
}

func (o orderPlaced) Validate() error {
	if o.OrderID == "" {
		return &idem.FieldError{Field: "orderId", Problem: "is missing"}
	}
	for i, l := range o.Lines {
		if l.Quantity <= 0 {
			return &idem.FieldError{Field: fmt.Sprintf("lines[%d].quantity", i), Problem: fmt.Sprintf("%d is not positive", l.Quantity)}
		}
	}
	return nil
}

// pointerRules has its Validate on the pointer.
type pointerRules struct {
	N int `json:"n"`
}

func (p *pointerRules) Validate() error {
	if p.N > 10 {
		return errors.New("n above 10")
	}
	return nil
}

func rawEvent(payload string) idem.Event {
	return idem.Event{ID: idem.NewEventID(), Name: "order.order.placed.v1", AggregateType: "order", AggregateID: "42", Payload: []byte(payload)}
}

func TestDecodeJSON(t *testing.T) {
	good, err := inbox.DecodeJSON[orderPlaced](rawEvent(`{"orderId": "42", "lines": [{"productId": "p", "quantity": 2}]}`))
	if err != nil || good.OrderID != "42" || len(good.Lines) != 1 || good.Lines[0].Quantity != 2 {
		t.Fatalf("DecodeJSON = %+v, %v", good, err)
	}
	for _, tc := range []struct {
		payload, field, want string
	}{
		{`{"orderId": "42", "lines": [], "extra": 1}`, "extra", `unknown field "extra"`},
		{`{"orderId": "42", "lines": [{"productId": "p", "quantity": "2"}]}`, "lines.quantity", "cannot unmarshal string"},
		{`{"orderId": "42", "lines": []} {"orderId": "43"}`, "", "data after the JSON value"},
		{`{"orderId": "42", "lines": [] `, "", "unexpected EOF"},
		{``, "", "the payload is empty"},
		{` null `, "", "the payload is null"},
		{`{"lines": []}`, "orderId", "orderId is missing"},
		{`{"orderId": "42", "lines": [{"productId": "p", "quantity": 1}, {"productId": "q", "quantity": 0}]}`, "lines[1].quantity", "0 is not positive"},
	} {
		ev := rawEvent(tc.payload)
		_, err := inbox.DecodeJSON[orderPlaced](ev)
		var pe *inbox.PayloadError
		if !errors.As(err, &pe) || !idem.IsPermanent(err) {
			t.Errorf("%s: %v, want a permanent *PayloadError", tc.payload, err)
			continue
		}
		if pe.Field != tc.field || pe.EventID != ev.ID || pe.EventName != ev.Name || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: field %q, error %q; want field %q and %q", tc.payload, pe.Field, err, tc.field, tc.want)
		}
	}
	if _, err := inbox.DecodeJSON[pointerRules](rawEvent(`{"n": 11}`)); err == nil || !strings.Contains(err.Error(), "n above 10") {
		t.Errorf("Validate on the pointer not run: %v", err)
	}
	if p, err := inbox.DecodeJSON[map[string]int](rawEvent(`{"a": 1}`)); err != nil || p["a"] != 1 {
		t.Errorf("a type without Validate: %v, %v", p, err)
	}
}

// TestHandleJSON: through a consumer, a valid payload reaches the typed
// handler, and one that breaks its type's rules is parked at once, the
// handler never called.
func TestHandleJSON(t *testing.T) {
	db := testdb.NewSQLite(t)
	c, err := inbox.New(db.Driver, inbox.Config{Name: "stock"})
	if err != nil {
		t.Fatal(err)
	}
	var got []orderPlaced
	inbox.HandleJSON(c, "order.order.placed.v1", func(_ context.Context, _ *sql.Tx, _ idem.Event, o orderPlaced) error {
		got = append(got, o)
		return nil
	})
	ctx := context.Background()
	outcome, err := c.Process(ctx, rawEvent(`{"orderId": "42", "lines": [{"productId": "p", "quantity": 2}]}`))
	if err != nil || outcome != inbox.Applied || len(got) != 1 || got[0].Lines[0].ProductID != "p" {
		t.Fatalf("valid payload: %v, %v, %+v", outcome, err, got)
	}
	bad := rawEvent(`{"orderId": "42", "lines": [{"productId": "p", "quantity": -1}]}`)
	msg, err := idem.NewMessage(bad)
	if err != nil {
		t.Fatal(err)
	}
	d, err := c.Deliver(ctx, inbox.Delivery{Message: msg, Source: "stock.events", Attempt: 1})
	var pe *inbox.PayloadError
	if err != nil || d.Outcome != inbox.Parked || !errors.As(d.Err, &pe) || pe.Field != "lines[0].quantity" || len(got) != 1 {
		t.Fatalf("invalid payload: %+v, %v; handler calls %d", d, err, len(got))
	}
	if n := db.Count(t, "failed_message"); n != 1 {
		t.Errorf("%d parked messages, want 1", n)
	}
}

// TestHandleJSONRefusesBytes: an event whose content type is not JSON never
// reaches a JSON handler: it is parked at once, the error naming the content
// type, with the message's bytes as received; re-driven to a consumer that
// handles its bytes, it is applied and leaves the failure store.
func TestHandleJSONRefusesBytes(t *testing.T) {
	ev := rawEvent("\x08\x96\x01\x00\xff")
	ev.ContentType = "application/x-protobuf"
	if _, err := inbox.DecodeJSON[orderPlaced](ev); !idem.IsPermanent(err) || !strings.Contains(err.Error(), `content type "application/x-protobuf" is not JSON`) {
		t.Fatalf("DecodeJSON of bytes: %v", err)
	}
	db := testdb.NewSQLite(t)
	c, err := inbox.New(db.Driver, inbox.Config{Name: "stock"})
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	inbox.HandleJSON(c, "order.order.placed.v1", func(context.Context, *sql.Tx, idem.Event, orderPlaced) error {
		calls++
		return nil
	})
	ctx := context.Background()
	msg, err := idem.NewMessage(ev)
	if err != nil {
		t.Fatal(err)
	}
	d, err := c.Deliver(ctx, inbox.Delivery{Message: msg, Source: "stock.events", Attempt: 1})
	if err != nil || d.Outcome != inbox.Parked || calls != 0 || !strings.Contains(d.Err.Error(), "application/x-protobuf") {
		t.Fatalf("bytes to a JSON handler: %+v, %v; handler calls %d", d, err, calls)
	}
	parked, err := c.Failures().List(ctx, idem.FailedFilter{})
	if err != nil || len(parked) != 1 || string(parked[0].Body) != string(msg.Body) || !strings.Contains(parked[0].Error, "application/x-protobuf") {
		t.Fatalf("failure store: %+v, %v", parked, err)
	}

	fixed, err := inbox.New(db.Driver, inbox.Config{Name: "stock"})
	if err != nil {
		t.Fatal(err)
	}
	var got idem.Event
	fixed.Handle("order.order.placed.v1", func(_ context.Context, _ *sql.Tx, ev idem.Event) error {
		got = ev
		return nil
	})
	again := idem.Message{EventID: parked[0].EventID, Key: parked[0].Key, Body: parked[0].Body,
		Headers: map[string]string{idem.HeaderRedrive: fmt.Sprint(parked[0].ID)}}
	d, err = fixed.Deliver(ctx, inbox.Delivery{Message: again, Source: "stock.events", Attempt: 1})
	if err != nil || d.Outcome != inbox.Applied || got.ContentType != ev.ContentType || string(got.Payload) != string(ev.Payload) {
		t.Fatalf("re-driven: %+v, %v; handled %q %q", d, err, got.ContentType, got.Payload)
	}
	if n := db.Count(t, "failed_message"); n != 0 {
		t.Errorf("%d parked messages after the re-drive, want 0", n)
	}
}
