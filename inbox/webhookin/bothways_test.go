package webhookin_test

import (
	"context"
	"database/sql"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/webhook"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/inbox/webhookin"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testlog"
)

// TestFromIdem: what broker/webhook sends in its mode PerMessage, signed,
// a Handler with StandardWebhooks receives: each event applied once under
// its own event id, a second publish of the same messages all duplicates,
// a publisher with another secret refused as a whole.
func TestFromIdem(t *testing.T) {
	s := testdb.NewSQLite(t)
	c, err := inbox.New(s.Driver, inbox.Config{Name: "billing", Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	applied := map[uuid.UUID]int{}
	c.Handle("order.order.placed.v1", func(_ context.Context, _ *sql.Tx, ev idem.Event) error {
		mu.Lock()
		defer mu.Unlock()
		applied[ev.ID]++
		return nil
	})
	h, err := webhookin.New(c, webhookin.Config{Provider: webhookin.StandardWebhooks{Secrets: []string{swSecret}}, Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	pub, err := webhook.NewPublisher(webhook.Config{URL: srv.URL, Mode: webhook.PerMessage, Secrets: []string{swSecretNext, swSecret}})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	var msgs []idem.Message
	for i := range 3 {
		ev, err := idem.NewEvent("order.order.placed.v1", "order", string(rune('a'+i)), map[string]int{"lines": i})
		if err != nil {
			t.Fatal(err)
		}
		m, err := idem.NewMessage(ev)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	for range 2 {
		if err := pub.Publish(context.Background(), msgs); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	for _, m := range msgs {
		if applied[m.EventID] != 1 {
			t.Errorf("event %s applied %d times, want once", m.EventID, applied[m.EventID])
		}
	}
	if len(applied) != len(msgs) {
		t.Errorf("%d events applied, want %d", len(applied), len(msgs))
	}
	mu.Unlock()

	forger, err := webhook.NewPublisher(webhook.Config{URL: srv.URL, Mode: webhook.PerMessage, Secrets: []string{swSecretNext}})
	if err != nil {
		t.Fatal(err)
	}
	defer forger.Close()
	if err := forger.Publish(context.Background(), msgs[:1]); err == nil {
		t.Error("a publisher with another secret: accepted")
	}
}
