package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
)

// TestFailedEditRedirectArchive: a message parked for a bad body is edited
// (body and a header, by alice), shown with its original and audit trail,
// and retried: the consumer applies the edited message. Another is sent to
// another consumer only (retry --to-consumer, by bob, with
// --failure-events), which applies it, and archived: out of the list, in
// list --archived, with a resolved notice in the outbox. A third is
// archived (by carol).
func TestFailedEditRedirectArchive(t *testing.T) {
	t.Parallel()
	url := testamqp.URL(t)
	pg := testdb.NewPostgres(t)
	exchange := testamqp.Name("idem_t_")
	pg.Exec(t, `CREATE TABLE reservation (consumer text NOT NULL, event_id uuid NOT NULL, fix text NOT NULL)`)
	subscribe := func(name, queue string, bindings ...string) *inbox.Consumer[pgx.Tx] {
		c, err := inbox.New[pgx.Tx](pg.Driver, inbox.Config{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		c.Handle(inbox.AnyEvent, func(ctx context.Context, tx pgx.Tx, ev idemmsg.Event) error {
			if !bytes.Contains(ev.Payload, []byte("fixed")) {
				return idemmsg.Permanent(errors.New("order without lines"))
			}
			_, err := tx.Exec(ctx, `INSERT INTO reservation VALUES ($1, $2, $3)`, name, ev.ID, ev.Headers["x-fix"])
			return err
		})
		sub, err := amqp.NewSubscriber(amqp.SubscriberConfig{ConnConfig: amqp.ConnConfig{URL: url}, Exchange: exchange,
			Queue: queue, Bindings: bindings}, c.DeliverBatch)
		if err != nil {
			t.Fatal(err)
		}
		if err := sub.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Stop(context.Background()) })
		return c
	}
	stock := subscribe("stock", exchange+".stock", "order.#")
	// billing reads its queue by the default name (amqp.QueueName), which
	// "retry --to-consumer" publishes to; no binding brings it orders.
	billingName := exchange + "-billing"
	billing := subscribe(billingName, amqp.QueueName(billingName), "billing.#")

	pub, err := amqp.NewPublisher(amqp.PublisherConfig{ConnConfig: amqp.ConnConfig{URL: url}, Exchange: exchange})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	var evs []idemmsg.Event
	for i := range 3 {
		ev, err := idemmsg.NewEvent("order.order.placed.v1", "order", strconv.Itoa(i), map[string]any{"lines": []int{}})
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
		publishEvents(t, pub, ev)
	}
	waitFor(t, "three messages parked", func() bool { return stock.Stats().Parked == 3 })
	stored, err := stock.Failures().List(context.Background(), idemmsg.FailedFilter{Oldest: true})
	if err != nil || len(stored) != 3 {
		t.Fatalf("stored: %v %v", stored, err)
	}
	ids := make([]string, 3)
	for i, m := range stored {
		ids[i] = strconv.FormatInt(m.ID, 10)
	}
	env := map[string]string{"IDEM_DB_URL": pg.URL, "IDEM_BROKER_URL": url, "USER": "ops"}

	// Edit: the body from a file, a header set, by alice.
	fixed := evs[0]
	fixed.Payload = []byte(`{"lines":[1],"fixed":true}`)
	fixedMsg, err := idemmsg.NewMessage(fixed)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "fixed.json")
	if err := os.WriteFile(file, fixedMsg.Body, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := idem(t, env, "", "failed", "edit", ids[0], "--body-file", file, "--header", "x-fix=by-hand", "--by", "alice")
	if code != 0 || !strings.Contains(out, "Edited "+ids[0]) || !strings.Contains(out, "headers set x-fix") {
		t.Fatalf("failed edit = %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = idem(t, env, "", "failed", "show", ids[0])
	if code != 0 || !strings.Contains(out, "as edited") || !strings.Contains(out, string(fixedMsg.Body)) ||
		!strings.Contains(out, "Original body") || !strings.Contains(out, string(stored[0].Body)) ||
		!strings.Contains(out, "edit     by alice") || !strings.Contains(out, "x-fix: by-hand") {
		t.Fatalf("failed show of the edited message = %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = idem(t, env, "", "failed", "retry", ids[0])
	if code != 0 || !strings.Contains(out, "Retried "+ids[0]) {
		t.Fatalf("failed retry of the edited message = %d\n%s%s", code, out, errOut)
	}
	waitFor(t, "the edited message applied", func() bool { return stock.Stats().Applied == 1 })
	if n := pg.Count(t, "reservation WHERE consumer = 'stock' AND event_id = $1 AND fix = 'by-hand'", evs[0].ID); n != 1 {
		t.Fatalf("reservations of the edited message: %d, want 1, with its edited header", n)
	}

	// Redirect, with a notice: billing applies it, stock's entry is
	// archived. billing's handler wants "fixed": edit it first.
	fixed = evs[1]
	fixed.Payload = []byte(`{"lines":[2],"fixed":true}`)
	if fixedMsg, err = idemmsg.NewMessage(fixed); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = idem(t, env, string(fixedMsg.Body), "failed", "edit", ids[1], "--body-file", "-")
	if code != 0 || !strings.Contains(out, "Edited "+ids[1]) {
		t.Fatalf("failed edit from the standard input = %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = idem(t, env, "", "failed", "retry", ids[1], "--to-consumer", billingName, "--by", "bob", "--failure-events")
	if code != 0 || !strings.Contains(out, "Sent "+ids[1]) {
		t.Fatalf("failed retry --to-consumer = %d\n%s%s", code, out, errOut)
	}
	waitFor(t, "billing applied the redirected message", func() bool { return billing.Stats().Applied == 1 })
	if n := pg.Count(t, "reservation WHERE consumer = $1 AND event_id = $2", billingName, evs[1].ID); n != 1 {
		t.Fatalf("billing's reservations of the redirected message: %d, want 1", n)
	}
	if n := pg.Count(t, "outbox WHERE type = $1 AND payload->>'resolution' = 'redirected' AND payload->>'by' = 'bob'", idemmsg.FailureMessageResolved); n != 1 {
		t.Errorf("resolved notices of the redirect in the outbox: %d, want 1", n)
	}

	// Archive, by $USER's default; then the lists.
	code, out, errOut = idem(t, env, "", "failed", "archive", ids[2])
	if code != 0 || !strings.Contains(out, "Archived "+ids[2]) {
		t.Fatalf("failed archive = %d\n%s%s", code, out, errOut)
	}
	code, out, _ = idem(t, env, "", "failed", "list")
	if code != 0 || !strings.Contains(out, "No failed message") {
		t.Errorf("failed list with every message archived = %d\n%s", code, out)
	}
	code, out, _ = idem(t, env, "", "failed", "list", "--archived")
	if code != 0 || !strings.Contains(out, evs[1].ID.String()) || !strings.Contains(out, evs[2].ID.String()) {
		t.Errorf("failed list --archived = %d\n%s", code, out)
	}
	code, out, _ = idem(t, env, "", "failed", "show", ids[1])
	if code != 0 || !strings.Contains(out, "Archived:") || !strings.Contains(out, "redirect by bob: to consumer "+billingName) {
		t.Errorf("failed show of the redirected message = %d\n%s", code, out)
	}
	code, out, _ = idem(t, env, "", "failed", "show", ids[2])
	if code != 0 || !strings.Contains(out, "archive  by ops") {
		t.Errorf("failed show of the archived message = %d\n%s", code, out)
	}
	if n := stock.Stats().Applied; n != 1 {
		t.Errorf("stock applied %d messages, want the edited one only", n)
	}
}

// publishEvents publishes evs through pub.
func publishEvents(t *testing.T, pub broker.Publisher, evs ...idemmsg.Event) {
	t.Helper()
	var msgs []idemmsg.Message
	for _, ev := range evs {
		m, err := idemmsg.NewMessage(ev)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	if err := pub.Publish(context.Background(), msgs); err != nil {
		t.Fatal(err)
	}
}
