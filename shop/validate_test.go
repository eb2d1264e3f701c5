package shop_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/shop"
	"github.com/idem-go/idem/shop/internal/shoptest"
)

func TestNormalizeQuantity(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"2": "2.000", "2.5": "2.500", "002.000": "2.000", "0.001": "0.001", "999999999.999": "999999999.999"} {
		if got, err := shop.NormalizeQuantity(in); err != nil || got != want {
			t.Errorf("%s: %q %v, want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "0.000", "1.0001", "-1", "-7", "+1", "1e3", "abc", " 1", "1.", ".5", "1234567890"} {
		if _, err := shop.NormalizeQuantity(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// decodeOrderPlaced decodes as the shop's handlers do: inbox.DecodeJSON,
// then shop.CheckOrder (shop.ForOrder).
func decodeOrderPlaced(ev idem.Event) (shop.OrderPlacedV1, error) {
	p, err := inbox.DecodeJSON[shop.OrderPlacedV1](ev)
	if err == nil {
		err = shop.CheckOrder(ev, p)
	}
	return p, err
}

// TestDecodeOrderPlaced checks that every impossible payload is a permanent
// error that names what is wrong, and that a good one decodes.
func TestDecodeOrderPlaced(t *testing.T) {
	t.Parallel()
	id := shoptest.OrderID()
	want := map[string]string{
		"missing order id":    "orderId is missing",
		"malformed order id":  "orderId \"42; DROP TABLE\" is not a UUID",
		"other order id":      "aggregate_id",
		"missing customer id": "customerId is missing",
		"no lines":            "lines has 0 lines",
		"null lines":          "lines has 0 lines",
		"duplicate product":   "lines[1].productId \"p-1\" is also on lines[0]",
		"negative quantity":   "lines[0].quantity quantity \"-7\" is not a decimal",
		"zero quantity":       "must be positive",
		"malformed quantity":  "\"1e3\" is not a decimal",
		"quantity as number":  "cannot unmarshal number",
		"order id as number":  "cannot unmarshal number",
		"lines not a list":    "cannot unmarshal string",
		"payload not object":  "cannot unmarshal array",
		"null payload":        "the payload is null",
	}
	for what, payload := range shoptest.BadOrderPlaced(id) {
		ev := shoptest.Event(t, shop.OrderPlaced, id, 1, payload)
		_, err := decodeOrderPlaced(ev)
		var inv *inbox.PayloadError
		switch {
		case err == nil:
			t.Errorf("%s: accepted", what)
		case !idem.IsPermanent(err) || !errors.As(err, &inv):
			t.Errorf("%s: %v is not a permanent inbox.PayloadError", what, err)
		case !strings.Contains(err.Error(), want[what]) || !strings.Contains(err.Error(), ev.ID.String()):
			t.Errorf("%s: %q does not say %q and the event id", what, err, want[what])
		}
	}
	p, err := decodeOrderPlaced(shoptest.Event(t, shop.OrderPlaced, id, 1, shoptest.GoodOrderPlaced(id)))
	if err != nil || p.OrderID != id || len(p.Lines) != 2 {
		t.Fatalf("good payload: %+v %v", p, err)
	}
}

func TestValidateOtherPayloads(t *testing.T) {
	t.Parallel()
	id, other := shoptest.OrderID(), shoptest.OrderID()
	for _, c := range []struct {
		name string
		p    interface{ Validate() error }
		ok   bool
	}{
		{"cancelled", shop.OrderCancelledV1{OrderID: id}, true},
		{"cancelled, upper-case id", shop.OrderCancelledV1{OrderID: strings.ToUpper(id)}, false},
		{"cancelled, braces", shop.OrderCancelledV1{OrderID: "{" + id + "}"}, false},
		{"cancelled, no id", shop.OrderCancelledV1{}, false},
		{"preparation created", shop.PreparationCreatedV1{OrderID: id, PreparationID: other}, true},
		{"preparation created, no preparation", shop.PreparationCreatedV1{OrderID: id}, false},
		{"preparation cancelled, none made", shop.PreparationCancelledV1{OrderID: id}, true},
		{"preparation cancelled, bad preparation", shop.PreparationCancelledV1{OrderID: id, PreparationID: "x"}, false},
		{"shipment requested", shop.ShipmentRequestedV1{OrderID: id, PickupID: "pk-1", IdempotencyKey: "shipment:" + id + ":initial"}, true},
		{"shipment requested, pickup with a space", shop.ShipmentRequestedV1{OrderID: id, PickupID: "pk 1", IdempotencyKey: "k"}, false},
		{"shipment requested, no key", shop.ShipmentRequestedV1{OrderID: id, PickupID: "pk-1"}, false},
		{"shipment cancelled", shop.ShipmentCancelledV1{OrderID: id, PickupID: "pk-1", IdempotencyKey: "shipment:" + id + ":cancel"}, true},
		{"shipment cancelled, no pickup", shop.ShipmentCancelledV1{OrderID: id, IdempotencyKey: "k"}, false},
		{"invoice", shop.InvoiceCreatedV1{OrderID: id, InvoiceID: other, CustomerID: "c-1", Lines: 2}, true},
		{"invoice, no lines", shop.InvoiceCreatedV1{OrderID: id, InvoiceID: other, CustomerID: "c-1"}, false},
		{"invoice, negative lines", shop.InvoiceCreatedV1{OrderID: id, InvoiceID: other, CustomerID: "c-1", Lines: -1}, false},
		{"invoice, no customer", shop.InvoiceCreatedV1{OrderID: id, InvoiceID: other, Lines: 1}, false},
		{"invoice voided", shop.InvoiceVoidedV1{OrderID: id, InvoiceID: other, CustomerID: "c-1"}, true},
		{"invoice voided, no invoice", shop.InvoiceVoidedV1{OrderID: id, CustomerID: "c-1"}, false},
	} {
		if err := c.p.Validate(); (err == nil) != c.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", c.name, err, c.ok)
		}
	}
}
