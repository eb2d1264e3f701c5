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
	mail, client := shoptest.Carrier(t)
	s, err := New(db, client, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, db, mail
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
	id := shoptest.OrderID()
	bad := shoptest.BadOrderPlaced(id)
	for what, payload := range bad {
		d := shoptest.Deliver(t, s.invoice, shoptest.Event(t, shop.OrderPlaced, id, 1, payload))
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
	badInvoices := map[string]string{
		"missing order id":   `{"invoiceId":"` + inv + `","customerId":"c-1","lines":1}`,
		"malformed order id": `{"orderId":"42","invoiceId":"` + inv + `","customerId":"c-1","lines":1}`,
		"missing invoice id": `{"orderId":"` + id + `","customerId":"c-1","lines":1}`,
		"bad customer id":    `{"orderId":"` + id + `","invoiceId":"` + inv + `","customerId":"c 1","lines":1}`,
		"no lines":           `{"orderId":"` + id + `","invoiceId":"` + inv + `","customerId":"c-1","lines":0}`,
		"lines as string":    `{"orderId":"` + id + `","invoiceId":"` + inv + `","customerId":"c-1","lines":"1"}`,
	}
	for what, payload := range badInvoices {
		d := shoptest.Deliver(t, s.mailer, shoptest.Event(t, shop.InvoiceCreated, id, 1, payload))
		if d.Outcome != inbox.Parked || !idem.IsPermanent(d.Err) {
			t.Errorf("invoice created, %s: outcome %v (%v), want parked", what, d.Outcome, d.Err)
		}
	}
	if n := emails(t, mail); n != 0 {
		t.Fatalf("%d e-mails sent for impossible invoices", n)
	}

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
