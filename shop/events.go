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
	// PreparationCancelled is published by shipping when it cancels the
	// preparation of a cancelled order.
	PreparationCancelled = "shipping.preparation.cancelled.v1"
	// ShipmentRequested is published by shipping once the carrier accepted
	// the pickup of an order's parcel.
	ShipmentRequested = "shipping.shipment.requested.v1"
	// InvoiceCreated is published by billing when it invoices an order.
	InvoiceCreated = "billing.invoice.created.v1"
)

// Aggregate types of the shop's events. Every event's aggregate id is the
// order id, so that all the events about one order share a Kafka key.
const (
	AggregateOrder       = "order"
	AggregatePreparation = "preparation"
	AggregateInvoice     = "invoice"
)

// OrderPlacedV1 is the payload of order.order.placed.v1.
type OrderPlacedV1 struct {
	OrderID    string      `json:"orderId"`
	CustomerID string      `json:"customerId"`
	Lines      []OrderLine `json:"lines"`
}

// OrderLine is one line of an order. Quantity is a decimal string with three
// decimals, such as "2.000".
type OrderLine struct {
	ProductID string `json:"productId"`
	Quantity  string `json:"quantity"`
}

// OrderCancelledV1 is the payload of order.order.cancelled.v1.
type OrderCancelledV1 struct {
	OrderID string `json:"orderId"`
}

// PreparationCreatedV1 is the payload of shipping.preparation.created.v1.
type PreparationCreatedV1 struct {
	OrderID       string `json:"orderId"`
	PreparationID string `json:"preparationId"`
}

// PreparationCancelledV1 is the payload of shipping.preparation.cancelled.v1.
type PreparationCancelledV1 struct {
	OrderID       string `json:"orderId"`
	PreparationID string `json:"preparationId"`
}

// ShipmentRequestedV1 is the payload of shipping.shipment.requested.v1.
type ShipmentRequestedV1 struct {
	OrderID  string `json:"orderId"`
	PickupID string `json:"pickupId"`
	// IdempotencyKey is the key the carrier was asked with:
	// shipment:<order id>:initial.
	IdempotencyKey string `json:"idempotencyKey"`
}

// InvoiceCreatedV1 is the payload of billing.invoice.created.v1.
type InvoiceCreatedV1 struct {
	OrderID    string `json:"orderId"`
	InvoiceID  string `json:"invoiceId"`
	CustomerID string `json:"customerId"`
	Lines      int    `json:"lines"`
}

// eventAggregates maps each event name to the aggregate type of its events.
var eventAggregates = map[string]string{
	OrderPlaced:          AggregateOrder,
	OrderCancelled:       AggregateOrder,
	PreparationCreated:   AggregatePreparation,
	PreparationCancelled: AggregatePreparation,
	ShipmentRequested:    AggregatePreparation,
	InvoiceCreated:       AggregateInvoice,
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
