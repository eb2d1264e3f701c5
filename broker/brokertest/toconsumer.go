package brokertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
)

// testToConsumer: with Features.ConsumerPublisher, a message published with
// PublishToConsumer reaches that consumer only, with a full set of
// attempts: another consumer bound to its event applies the message of
// the same key published after it, never it. Parked there, and redirected
// from the failure store to the other consumer (inbox.FailureStore.Redirect,
// "idem failed retry --to-consumer"), it reaches that one, which applies it
// once; its entry is archived, the redirect in its audit trail, and the
// message held behind it stays. Without the feature, the publisher must not
// claim to be a broker.ConsumerPublisher.
func testToConsumer(t *testing.T, tr Transport) {
	name := "test.order.placed.v1"
	b := setup(t, tr, Options{EventNames: []string{name}, Consumers: []string{"stock", "billing"}})
	cp, ok := b.inst.Publisher.(broker.ConsumerPublisher)
	if ok != tr.Features.ConsumerPublisher {
		t.Fatalf("the publisher (%T) is a broker.ConsumerPublisher: %v; Features.ConsumerPublisher: %v", b.inst.Publisher, ok, tr.Features.ConsumerPublisher)
	}
	if !ok {
		return
	}
	only, after := NewMessage(t, name, "7", 0), NewMessage(t, name, "7", 1)
	only.Headers[idem.HeaderAttempt] = "9"
	stock := b.consumer(t, "stock", fastRetry, func(ev idem.Event) error {
		if ev.ID == only.EventID {
			return idem.Permanent(errors.New("no such warehouse"))
		}
		return nil
	})
	billing := b.consumer(t, "billing", fastRetry, nil)
	stockTape, _ := b.subscribe(t, "stock", stock)
	billingTape, _ := b.subscribe(t, "billing", billing)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cp.PublishToConsumer(ctx, "stock", []idem.Message{only}); err != nil {
		t.Fatalf("PublishToConsumer: %v", err)
	}
	Publish(t, b.inst.Publisher, after)
	b.waitFor(t, "billing applied the later message, stock parked the first and held the later one", func() bool {
		return billing.Stats().Applied >= 1 && stock.Stats().Parked == 2
	})
	if got := billingTape.of(only.EventID); len(got) != 0 {
		t.Fatalf("billing received %d copies of the message published to stock only", len(got))
	}
	if got := stockTape.attempts(only.EventID); len(got) != 1 || got[0] != 1 {
		t.Errorf("stock received the message with attempts %v, want [1] (the attempt header dropped)", got)
	}
	CheckOnceInOrder(t, b.pg, "billing", []idem.Message{after})

	fm := b.failures(t, stock, idem.FailedFilter{Consumer: "stock"})
	if len(fm) != 2 || fm[0].EventID != only.EventID || fm[1].HeldBy != fm[0].ID {
		t.Fatalf("stock's failure store = %+v, want the message and the later one held behind it", fm)
	}
	ops := stock.Failures().As("ops")
	if err := ops.Redirect(ctx, cp, fm[0], "billing"); err != nil {
		t.Fatalf("redirect: %v", err)
	}
	b.waitFor(t, "billing applied the redirected message", func() bool { return billing.Stats().Applied == 2 })
	CheckOnceInOrder(t, b.pg, "billing", []idem.Message{after, only})
	got, err := stock.Failures().Get(ctx, fm[0].ID)
	if err != nil {
		t.Fatalf("the redirected entry: %v", err)
	}
	if last := got.Actions; got.Archived.IsZero() || len(last) != 1 || last[0].Action != idem.FailedRedirect || last[0].By != "ops" {
		t.Errorf("the redirected entry: archived at %v, audit trail %+v; want archived, a redirect by ops", got.Archived, got.Actions)
	}
	if held := b.failures(t, stock, idem.FailedFilter{HeldBy: fm[0].ID}); len(held) != 1 {
		t.Errorf("%d messages held behind the redirected one, want the one that was", len(held))
	}
}
