package cdc_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/outbox"
)

// TestRefusedRowBeforeTheSlotQuarantined: a row waiting in the outbox when
// the slot is created, which the broker refuses on every attempt, is
// quarantined after QuarantineAfter refusals like any other message, and
// the relay goes on to its stream: the later rows of its aggregate and the
// rows written after the start are published.
func TestRefusedRowBeforeTheSlotQuarantined(t *testing.T) {
	t.Parallel()
	pg := newDB(t)
	w := outbox.NewWriter(pg.Driver)
	ctx := context.Background()
	bad := event(t, "a", 1)
	before := []idem.Event{bad, event(t, "a", 2), event(t, "b", 1), event(t, "b", 2)}
	if err := w.AddExec(ctx, pg.Driver.Pool(), before...); err != nil {
		t.Fatal(err)
	}
	pub := memory.New()
	pub.SetFunc(func(int, []idem.Message) memory.Action {
		return memory.Action{Refuse: func(m idem.Message) error {
			if m.EventID == bad.ID {
				return errors.New("no route")
			}
			return nil
		}}
	})
	cfg := fastConfig(t)
	cfg.QuarantineAfter = 3
	start(t, pg, pub, cfg)
	after := event(t, "a", 3)
	if err := w.AddExec(ctx, pg.Driver.Pool(), after); err != nil {
		t.Fatal(err)
	}
	msgs := waitLen(t, pub, len(before), 30*time.Second)
	got := map[string]bool{}
	for _, m := range msgs {
		ev := decode(t, m)
		got[fmt.Sprintf("%s/%d", ev.AggregateID, ev.AggregateVersion)] = true
	}
	for _, want := range []string{"a/2", "a/3", "b/1", "b/2"} {
		if !got[want] {
			t.Fatalf("%s not published; published %v", want, got)
		}
	}
	if got["a/1"] {
		t.Fatal("the refused row was published")
	}
	eventually(t, 20*time.Second, "the refused row quarantined, the others deleted", func() bool {
		return pg.Count(t, "outbox") == 1 &&
			pg.Count(t, "outbox WHERE id = $1 AND quarantined_at IS NOT NULL AND attempts = 3 AND last_error LIKE 'refused by the broker on 3 attempts%'", bad.ID) == 1
	})
}
