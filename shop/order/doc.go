// Package order is the shop's order service: an HTTP API that places and
// cancels orders, and a consumer of shipping's events that shows each
// order's fulfilment.
//
// POST /orders writes the order, its lines and the order.order.placed.v1
// outbox event in one transaction, and answers 201 Created with the order:
// status "confirmed", fulfilment "awaiting preparation" until shipping's
// events say more. The request may carry an Idempotency-Key header (see
// the IETF httpapi draft "The Idempotency-Key HTTP Header Field"):
//
//   - the same key with the same body replays the stored response, with the
//     header Idempotent-Replayed: true;
//   - the same key with another body is 422 Unprocessable Content;
//   - a retry while the first request still runs is 409 Conflict;
//   - keys are remembered for Config.KeyTTL (24 hours by default), then
//     purged.
//
// POST /orders/{id}/cancel cancels an order and publishes
// order.order.cancelled.v1; GET /orders/{id} shows the order.
package order
