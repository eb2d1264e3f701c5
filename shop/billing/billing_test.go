package billing

import (
	"context"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/shop"
	"github.com/idem-go/idem/shop/carrier"
	"github.com/idem-go/idem/shop/internal/shoptest"
	"github.com/idem-go/idem/shop/store"
)

func setup(t *testing.T) (*Service, *store.DB, *carrier.Server) {
	t.Helper()
	db := shoptest.Open(t, "billing", Migrations())
	mail := shoptest.Carrier(t)
	s, err := New(db, mail.Client, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, db, mail.Server
}

func emails(t *testing.T, mail *carrier.Server) int64 {
	t.Helper()
	st, err := mail.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st.Emails
}

// TestImpossibleEventsAreParked checks both billing consumers: an
// impossible order.order.placed.v1 makes no invoice, an impossible
// billing.invoice.created.v1 sends no e-mail; both are parked. Good events
// are applied.
func TestImpossibleEventsAreParked(t *testing.T) {
	t.Parallel()
	s, db, mail := setup(t)
	// Each impossible event is about an order of its own: a parked event
	// holds the later events of its order.
	bad := shoptest.BadOrderPlaced(shoptest.OrderID())
	for what := range bad {
		bid := shoptest.OrderID()
		d := shoptest.Deliver(t, s.invoice, shoptest.Event(t, shop.OrderPlaced, bid, 1, shoptest.BadOrderPlaced(bid)[what]))
		if d.Outcome != inbox.Parked || !idem.IsPermanent(d.Err) {
			t.Errorf("order placed, %s: outcome %v (%v), want parked", what, d.Outcome, d.Err)
		}
	}
	if n := shoptest.Count(t, db, `SELECT count(*) FROM invoice`); n != 0 {
		t.Fatalf("%d invoices from impossible orders", n)
	}
	if n := shoptest.Parked(t, db, InvoiceConsumer); n != int64(len(bad)) {
		t.Fatalf("%d parked by %s, want %d", n, InvoiceConsumer, len(bad))
	}

	inv := idem.NewEventID().String()
	badInvoices := func(id string) map[string]string {
		return map[string]string{
			"missing order id":   `{"invoiceId":"` + inv + `","customerId":"c-1","lines":1}`,
			"malformed order id": `{"orderId":"42","invoiceId":"` + inv + `","customerId":"c-1","lines":1}`,
			"missing invoice id": `{"orderId":"` + id + `","customerId":"c-1","lines":1}`,
			"bad customer id":    `{"orderId":"` + id + `","invoiceId":"` + inv + `","customerId":"c 1","lines":1}`,
			"no lines":           `{"orderId":"` + id + `","invoiceId":"` + inv + `","customerId":"c-1","lines":0}`,
			"lines as string":    `{"orderId":"` + id + `","invoiceId":"` + inv + `","customerId":"c-1","lines":"1"}`,
		}
	}
	for what := range badInvoices("") {
		bid := shoptest.OrderID()
		d := shoptest.Deliver(t, s.mailer, shoptest.Event(t, shop.InvoiceCreated, bid, 1, badInvoices(bid)[what]))
		if d.Outcome != inbox.Parked || !idem.IsPermanent(d.Err) {
			t.Errorf("invoice created, %s: outcome %v (%v), want parked", what, d.Outcome, d.Err)
		}
	}
	if n := emails(t, mail); n != 0 {
		t.Fatalf("%d e-mails sent for impossible invoices", n)
	}

	id := shoptest.OrderID()
	shoptest.Applied(t, s.invoice, shoptest.Event(t, shop.OrderPlaced, id, 1, shoptest.GoodOrderPlaced(id)))
	created := shoptest.Outbox(t, db, shop.InvoiceCreated)
	if len(created) != 1 {
		t.Fatalf("%d invoice.created events, want 1", len(created))
	}
	shoptest.Applied(t, s.mailer, created[0])
	if n := emails(t, mail); n != 1 {
		t.Fatalf("%d e-mails, want 1", n)
	}
}

// mailAll delivers every billing event in the outbox
// that was not delivered yet to the mailer, in order.
func mailAll(t *testing.T, s *Service, db *store.DB, seen map[string]bool) {
	t.Helper()
	for _, name := range []string{shop.InvoiceCreated, shop.InvoiceVoided} {
		for _, ev := range shoptest.Outbox(t, db, name) {
			if !seen[ev.ID.String()] {
				seen[ev.ID.String()] = true
				shoptest.Applied(t, s.mailer, ev)
			}
		}
	}
}

// TestCancelVoidsTheInvoice checks both orders of events: an invoice
// e-mailed before the cancellation is voided and the customer told once;
// an invoice voided before the mailer got to it is never e-mailed. An
// order placed after its cancellation is not invoiced.
func TestCancelVoidsTheInvoice(t *testing.T) {
	t.Parallel()
	s, db, mail := setup(t)
	seen := map[string]bool{}
	voided := func(id string) int64 {
		return shoptest.Count(t, db, `SELECT count(*) FROM invoice WHERE order_id = $1 AND voided_at IS NOT NULL`, id)
	}

	// E-mailed, then cancelled.
	a := shoptest.OrderID()
	shoptest.Applied(t, s.invoice, shoptest.Event(t, shop.OrderPlaced, a, 1, shoptest.GoodOrderPlaced(a)))
	mailAll(t, s, db, seen)
	cancelA := shoptest.Event(t, shop.OrderCancelled, a, 2, shop.OrderCancelledV1{OrderID: a})
	shoptest.Applied(t, s.invoice, cancelA)
	cancelA.ID = idem.NewEventID() // another copy: the invoice is voided already
	shoptest.Applied(t, s.invoice, cancelA)
	mailAll(t, s, db, seen)
	if voided(a) != 1 || len(shoptest.Outbox(t, db, shop.InvoiceVoided)) != 1 {
		t.Fatalf("order a: the invoice is not voided once")
	}
	if n := emails(t, mail); n != 2 {
		t.Fatalf("%d e-mails, want the invoice and its void notice", n)
	}
	again := shoptest.Outbox(t, db, shop.InvoiceVoided)[0]
	again.ID = idem.NewEventID()
	shoptest.Applied(t, s.mailer, again)
	if n := emails(t, mail); n != 2 {
		t.Fatalf("%d e-mails after a second voided event, want 2", n)
	}

	// Cancelled before the mailer got to the invoice.
	b := shoptest.OrderID()
	shoptest.Applied(t, s.invoice, shoptest.Event(t, shop.OrderPlaced, b, 1, shoptest.GoodOrderPlaced(b)))
	shoptest.Applied(t, s.invoice, shoptest.Event(t, shop.OrderCancelled, b, 2, shop.OrderCancelledV1{OrderID: b}))
	mailAll(t, s, db, seen)
	if voided(b) != 1 {
		t.Fatal("order b: the invoice is not voided")
	}
	if n := emails(t, mail); n != 2 {
		t.Fatalf("%d e-mails, want none for order b", n)
	}

	// Cancelled before it was placed.
	c := shoptest.OrderID()
	shoptest.Applied(t, s.invoice, shoptest.Event(t, shop.OrderCancelled, c, 2, shop.OrderCancelledV1{OrderID: c}))
	shoptest.Applied(t, s.invoice, shoptest.Event(t, shop.OrderPlaced, c, 1, shoptest.GoodOrderPlaced(c)))
	if n := shoptest.Count(t, db, `SELECT count(*) FROM invoice WHERE order_id = $1`, c); n != 0 {
		t.Fatalf("%d invoices for an order placed after its cancellation", n)
	}
}

// TestEmailSentByACrashedAttemptIsVoided: the mailer's first attempt sent
// the invoice e-mail and crashed before its transaction committed the mark;
// meanwhile the order was cancelled, and the retry found the invoice voided
// and sent nothing. The voided event must still tell the customer, once:
// the mail service knows the e-mail by its key.
func TestEmailSentByACrashedAttemptIsVoided(t *testing.T) {
	t.Parallel()
	s, db, mail := setup(t)
	id := shoptest.OrderID()
	shoptest.Applied(t, s.invoice, shoptest.Event(t, shop.OrderPlaced, id, 1, shoptest.GoodOrderPlaced(id)))
	// The crashed attempt: the e-mail is sent, nothing committed.
	if _, err := s.mail.SendEmail(context.Background(), EmailKey(id), "c-1@customers.example", "Your invoice"); err != nil {
		t.Fatal(err)
	}
	shoptest.Applied(t, s.invoice, shoptest.Event(t, shop.OrderCancelled, id, 2, shop.OrderCancelledV1{OrderID: id}))
	mailAll(t, s, db, map[string]bool{})
	if n := emails(t, mail); n != 2 {
		t.Fatalf("%d e-mails, want the invoice and its void notice", n)
	}
	if n := shoptest.Count(t, db, `SELECT count(*) FROM invoice WHERE order_id = $1 AND email_id IS NOT NULL AND void_email_id IS NOT NULL`, id); n != 1 {
		t.Fatalf("the invoice is not marked e-mailed and told void")
	}
}

// TestAnnouncedInvoiceNotFoundWaits checks that the mailer, given an
// invoice event whose invoice it cannot find (not visible yet, as on a
// replica behind its primary), fails transiently: no e-mail sent, nothing
// parked, nothing marked; once the invoice is there, one e-mail and the
// invoice marked e-mailed.
func TestAnnouncedInvoiceNotFoundWaits(t *testing.T) {
	t.Parallel()
	s, db, mail := setup(t)
	id := shoptest.OrderID()
	inv := shop.InvoiceCreatedV1{OrderID: id, InvoiceID: idem.NewEventID().String(), CustomerID: "c-1", Lines: 1}
	created := shoptest.Event(t, shop.InvoiceCreated, id, 1, inv)
	voided := shoptest.Event(t, shop.InvoiceVoided, id, 2, shop.InvoiceVoidedV1{OrderID: id, InvoiceID: inv.InvoiceID, CustomerID: "c-1"})
	for _, ev := range []idem.Event{created, voided} {
		o, err := s.mailer.Process(context.Background(), ev)
		if o != inbox.Failed || !idem.IsTransient(err) || idem.IsPermanent(err) {
			t.Fatalf("%s, invoice not found: %v %v, want a transient failure", ev.Name, o, err)
		}
	}
	if n := emails(t, mail); n != 0 {
		t.Fatalf("%d e-mails sent for an invoice not found", n)
	}
	if n := shoptest.Parked(t, db, MailerConsumer); n != 0 {
		t.Fatalf("%d messages parked", n)
	}

	shoptest.Applied(t, s.invoice, shoptest.Event(t, shop.OrderPlaced, id, 1, shoptest.GoodOrderPlaced(id)))
	shoptest.Applied(t, s.mailer, shoptest.Outbox(t, db, shop.InvoiceCreated)[0])
	if n := emails(t, mail); n != 1 {
		t.Fatalf("%d e-mails, want 1", n)
	}
	if n := shoptest.Count(t, db, `SELECT count(*) FROM invoice WHERE order_id = $1 AND emailed_at IS NOT NULL`, id); n != 1 {
		t.Fatalf("%d invoices marked e-mailed, want 1", n)
	}
}
