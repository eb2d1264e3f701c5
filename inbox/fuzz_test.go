package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"maps"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
)

// FuzzDeliver hands the consumer a message with any body, key and headers
// (an event id, an event type, a re-drive id): whatever it holds, the
// consumer never fails on it nor leaves it unacknowledged (G6): the event
// is applied, or the message is parked, its body and headers kept byte for
// byte (G9).
func FuzzDeliver(f *testing.F) {
	env, err := idem.NewEvent("order.order.placed.v1", "order", "42", map[string]int{"lines": 2})
	if err != nil {
		f.Fatal(err)
	}
	m, err := idem.NewMessage(env)
	if err != nil {
		f.Fatal(err)
	}
	id := "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
	f.Add(m.Body, m.Key, "", "", "", "")
	f.Add([]byte(`{"orderId":42}`), []byte(`"42"`), id, "OrderCreated", "", "v")
	f.Add([]byte(`"{\"orderId\":42}"`), []byte(`{"schema":{},"payload":"42"}`), id, "", "", "")
	f.Add([]byte(`not json`), []byte{}, "", "", "1", "")
	f.Add([]byte("\xff\xfe\x00"), []byte("\xff"), "\x00", "\xff", "-1", "\xff\x00")
	f.Add(m.Body, m.Key, "", "", "9223372036854775807", "")
	f.Add([]byte(`{"event_id":"`+id+`","event_name":"a","aggregate_type":"\u0000","aggregate_id":"\udfff","payload":null}`), []byte{}, "", "", "", "")
	db := testdb.NewSQLite(f)
	fs := inbox.NewFailureStore(db.Driver)
	var n int
	f.Fuzz(func(t *testing.T, body, key []byte, eventID, eventType, redrive, other string) {
		n++
		name := fmt.Sprint("fuzz-", n)
		c, err := inbox.New[*sql.Tx](db.Driver, inbox.Config{Name: name, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		c.Handle(inbox.AnyEvent, func(context.Context, *sql.Tx, idem.Event) error { return nil })
		headers := map[string]string{}
		for k, v := range map[string]string{idem.HeaderEventID: eventID, idem.HeaderEventType: eventType,
			idem.HeaderRedrive: redrive, "x-other": other} {
			if v != "" {
				headers[k] = v
			}
		}
		ctx := context.Background()
		d, err := c.Deliver(ctx, inbox.Delivery{Message: idem.Message{Body: body, Key: key, Headers: headers}, Source: "fuzz.events"})
		if err != nil {
			t.Fatalf("Deliver: %v (disposition %+v)", err, d)
		}
		if d.Action != inbox.Ack {
			t.Fatalf("disposition %+v, want Ack", d)
		}
		switch d.Outcome {
		case inbox.Applied, inbox.Ignored:
			return
		case inbox.Parked:
		default:
			t.Fatalf("outcome %v, want applied or parked", d.Outcome)
		}
		parked, err := fs.List(ctx, idem.FailedFilter{Consumer: name})
		if err != nil {
			t.Fatal(err)
		}
		if len(parked) != 1 {
			t.Fatalf("%d messages parked for the consumer, want 1", len(parked))
		}
		want := maps.Clone(headers)
		delete(want, idem.HeaderRedrive) // never stored
		if p := parked[0]; string(p.Body) != string(body) || string(p.Key) != string(key) || !maps.Equal(p.Headers, want) || p.Source != "fuzz.events" {
			t.Fatalf("parked body %q, key %q, headers %q, source %q; want %q, %q, %q, fuzz.events", p.Body, p.Key, p.Headers, p.Source, body, key, want)
		}
	})
}
