package shop

// Event names. They follow <service>.<aggregate>.<event>.v<N>.
const (
	// OrderPlaced is published by order when an order is committed.
	OrderPlaced = "order.order.placed.v1"
	// OrderCancelled is published by order when an order is cancelled.
	OrderCancelled = "order.order.cancelled.v1"
	// PreparationCreated is published by shipping when it creates the
	// preparation of an order.
	PreparationCreated = "shipping.preparation.created.v1"
	// PreparationCancelled is published by shipping when it learns that an
	// order is cancelled: its preparation is cancelled, or none will be made.
	PreparationCancelled = "shipping.preparation.cancelled.v1"
	// ShipmentRequested is published by shipping once the carrier accepted
	// the pickup of an order's parcel.
	ShipmentRequested = "shipping.shipment.requested.v1"
	// ShipmentCancelled is published by shipping once the carrier cancelled
	// the pickup of a cancelled order's parcel.
	ShipmentCancelled = "shipping.shipment.cancelled.v1"
	// InvoiceCreated is published by billing when it invoices an order.
	InvoiceCreated = "billing.invoice.created.v1"
	// InvoiceVoided is published by billing when it voids the invoice of a
	// cancelled order.
	InvoiceVoided = "billing.invoice.voided.v1"
)

// Aggregate types of the shop's events. Every event's aggregate id is the
// order id, so that all the events about one order share a Kafka key.
const (
	AggregateOrder       = "order"
	AggregatePreparation = "preparation"
	AggregateInvoice     = "invoice"
)

// The versions of the preparation and invoice aggregates after each of
// their events (idem.Event.AggregateVersion). An aggregate's events are
// always written in this order, whichever happen: a shipment is requested
// only for an active preparation, under the preparation's row lock, which
// its cancellation takes too; a shipment is cancelled only once its
// preparation is; an invoice is voided only once it exists. So a rank per
// event is a version that grows with every event of the aggregate (an
// event that does not happen leaves a gap), and a consumer can tell a late
// event from a new one. The order aggregate's versions are the order's
// own (its version column): 1 when placed, 2 when cancelled.
const (
	PreparationCreatedVersion   = 1
	ShipmentRequestedVersion    = 2
	PreparationCancelledVersion = 3
	ShipmentCancelledVersion    = 4
	InvoiceCreatedVersion       = 1
	InvoiceVoidedVersion        = 2
)

// OrderPlacedV1 is the payload of order.order.placed.v1.
type OrderPlacedV1 struct {
	OrderID    string      `json:"orderId"`
	CustomerID string      `json:"customerId"`
	Lines      []OrderLine `json:"lines"`
}

// Validate reports the first problem of the payload: an order id that is
// not a UUID, a customer or product id that is not an id (see ValidID), no
// lines or more than MaxLines, a product on two lines, or a quantity that
// NormalizeQuantity rejects. These are the rules of the order API.
func (p OrderPlacedV1) Validate() error {
	if err := checkUUID("orderId", p.OrderID); err != nil {
		return err
	}
	if err := checkID("customerId", p.CustomerID); err != nil {
		return err
	}
	if len(p.Lines) == 0 || len(p.Lines) > MaxLines {
		return fieldError("lines", "has %d lines; an order has 1 to %d", len(p.Lines), MaxLines)
	}
	seen := make(map[string]int, len(p.Lines))
	for i, l := range p.Lines {
		if err := l.validate(i); err != nil {
			return err
		}
		if j, dup := seen[l.ProductID]; dup {
			return fieldError(linesField(i, "productId"), "%q is also on lines[%d]; an order has one line per product", l.ProductID, j)
		}
		seen[l.ProductID] = i
	}
	return nil
}

func (p OrderPlacedV1) orderID() string { return p.OrderID }

// OrderLine is one line of an order. Quantity is a decimal string with three
// decimals, such as "2.000".
type OrderLine struct {
	ProductID string `json:"productId"`
	Quantity  string `json:"quantity"`
}

func (l OrderLine) validate(i int) error {
	if err := checkID(linesField(i, "productId"), l.ProductID); err != nil {
		return err
	}
	if _, err := NormalizeQuantity(l.Quantity); err != nil {
		return fieldError(linesField(i, "quantity"), "%v", err)
	}
	return nil
}

// OrderCancelledV1 is the payload of order.order.cancelled.v1.
type OrderCancelledV1 struct {
	OrderID string `json:"orderId"`
}

// Validate reports a missing or malformed order id.
func (p OrderCancelledV1) Validate() error { return checkUUID("orderId", p.OrderID) }

func (p OrderCancelledV1) orderID() string { return p.OrderID }

// PreparationCreatedV1 is the payload of shipping.preparation.created.v1.
type PreparationCreatedV1 struct {
	OrderID       string `json:"orderId"`
	PreparationID string `json:"preparationId"`
}

// Validate reports a missing or malformed order or preparation id.
func (p PreparationCreatedV1) Validate() error {
	if err := checkUUID("orderId", p.OrderID); err != nil {
		return err
	}
	return checkUUID("preparationId", p.PreparationID)
}

func (p PreparationCreatedV1) orderID() string { return p.OrderID }

// PreparationCancelledV1 is the payload of shipping.preparation.cancelled.v1.
type PreparationCancelledV1 struct {
	OrderID string `json:"orderId"`
	// PreparationID is the cancelled preparation, or empty when the order
	// was cancelled before shipping prepared it (none will be made).
	PreparationID string `json:"preparationId,omitempty"`
	// PickupID is the pickup requested already for the order, whose
	// cancellation follows (shipping.shipment.cancelled.v1), or empty.
	PickupID string `json:"pickupId,omitempty"`
}

// Validate reports a missing or malformed order id, or a preparation id
// (pickup id) that is neither empty nor a UUID (an id).
func (p PreparationCancelledV1) Validate() error {
	if err := checkUUID("orderId", p.OrderID); err != nil {
		return err
	}
	if p.PreparationID != "" {
		if err := checkUUID("preparationId", p.PreparationID); err != nil {
			return err
		}
	}
	if p.PickupID != "" {
		return checkID("pickupId", p.PickupID)
	}
	return nil
}

func (p PreparationCancelledV1) orderID() string { return p.OrderID }

// ShipmentRequestedV1 is the payload of shipping.shipment.requested.v1.
type ShipmentRequestedV1 struct {
	OrderID  string `json:"orderId"`
	PickupID string `json:"pickupId"`
	// IdempotencyKey is the key the carrier was asked with:
	// shipment:<order id>:initial.
	IdempotencyKey string `json:"idempotencyKey"`
}

// Validate reports a missing or malformed order or pickup id, or a missing
// idempotency key.
func (p ShipmentRequestedV1) Validate() error {
	return checkShipment(p.OrderID, p.PickupID, p.IdempotencyKey)
}

func (p ShipmentRequestedV1) orderID() string { return p.OrderID }

// ShipmentCancelledV1 is the payload of shipping.shipment.cancelled.v1.
type ShipmentCancelledV1 struct {
	OrderID  string `json:"orderId"`
	PickupID string `json:"pickupId"`
	// IdempotencyKey is the key the carrier was asked to cancel with:
	// shipment:<order id>:cancel.
	IdempotencyKey string `json:"idempotencyKey"`
}

// Validate reports a missing or malformed order or pickup id, or a missing
// idempotency key.
func (p ShipmentCancelledV1) Validate() error {
	return checkShipment(p.OrderID, p.PickupID, p.IdempotencyKey)
}

func (p ShipmentCancelledV1) orderID() string { return p.OrderID }

func checkShipment(orderID, pickupID, key string) error {
	if err := checkUUID("orderId", orderID); err != nil {
		return err
	}
	if err := checkID("pickupId", pickupID); err != nil {
		return err
	}
	if key == "" || len(key) > 255 {
		return fieldError("idempotencyKey", "must have 1 to 255 bytes")
	}
	return nil
}

// InvoiceCreatedV1 is the payload of billing.invoice.created.v1.
type InvoiceCreatedV1 struct {
	OrderID    string `json:"orderId"`
	InvoiceID  string `json:"invoiceId"`
	CustomerID string `json:"customerId"`
	Lines      int    `json:"lines"`
}

// Validate reports a missing or malformed order, invoice or customer id, or
// a number of lines outside 1 to MaxLines.
func (p InvoiceCreatedV1) Validate() error {
	if err := checkInvoice(p.OrderID, p.InvoiceID, p.CustomerID); err != nil {
		return err
	}
	if p.Lines < 1 || p.Lines > MaxLines {
		return fieldError("lines", "is %d; an order has 1 to %d lines", p.Lines, MaxLines)
	}
	return nil
}

func (p InvoiceCreatedV1) orderID() string { return p.OrderID }

// InvoiceVoidedV1 is the payload of billing.invoice.voided.v1.
type InvoiceVoidedV1 struct {
	OrderID    string `json:"orderId"`
	InvoiceID  string `json:"invoiceId"`
	CustomerID string `json:"customerId"`
}

// Validate reports a missing or malformed order, invoice or customer id.
func (p InvoiceVoidedV1) Validate() error {
	return checkInvoice(p.OrderID, p.InvoiceID, p.CustomerID)
}

func (p InvoiceVoidedV1) orderID() string { return p.OrderID }

func checkInvoice(orderID, invoiceID, customerID string) error {
	if err := checkUUID("orderId", orderID); err != nil {
		return err
	}
	if err := checkUUID("invoiceId", invoiceID); err != nil {
		return err
	}
	return checkID("customerId", customerID)
}

// eventAggregates maps each event name to the aggregate type of its events.
var eventAggregates = map[string]string{
	OrderPlaced:          AggregateOrder,
	OrderCancelled:       AggregateOrder,
	PreparationCreated:   AggregatePreparation,
	PreparationCancelled: AggregatePreparation,
	ShipmentRequested:    AggregatePreparation,
	ShipmentCancelled:    AggregatePreparation,
	InvoiceCreated:       AggregateInvoice,
	InvoiceVoided:        AggregateInvoice,
}

// AggregateTypes returns the aggregate types of the shop's events among
// names, once each: on Kafka, a consumer reads the topics of these types
// (outbox.event.<aggregate type>).
func AggregateTypes(names []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, n := range names {
		if t, ok := eventAggregates[n]; ok && !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	return out
}
