// Package order is the shop's order service: an HTTP API that places and
// cancels orders, and a consumer of shipping's events that shows each
// order's fulfilment.
//
// POST /orders writes the order, its lines and the order.order.placed.v1
// outbox event in one transaction, and answers 201 Created with the order:
// status "confirmed", fulfilment "awaiting preparation" until shipping's
// events say more. The request may carry an Idempotency-Key header (see
// the IETF httpapi draft "The Idempotency-Key HTTP Header Field"), handled
// by idem's package idempotency: the order's transaction claims the key
// (idempotency.Keys.TxHandler), so that the claim, the order, its event and
// the response to replay commit together, one commit per order. Keys live in idem's
// idempotent_request table (version 2 of the service's migrations moved
// them there from its own idempotency_key table):
//
//   - the same key with the same body replays the stored response, with the
//     header Idempotent-Replayed: true;
//   - the same key with another body is 422 Unprocessable Content;
//   - a retry while the first request still runs waits for it and gets its
//     response; after Config.KeyLockWait (5s) it is 409 Conflict;
//   - keys are remembered for Config.KeyTTL (24 hours by default), then
//     purged;
//   - the request's fingerprint is the method, the path and the exact bytes
//     of the body: a retry must send the same bytes (the same order with
//     other spacing or key order is another request, 422);
//   - a header that is present but empty, sent twice, longer than
//     MaxKeyLength bytes, not UTF-8 or with control characters is 400 Bad
//     Request: the request is never run without the key its client relies
//     on.
//
// The body must be one JSON object (whitespace may follow it, nothing
// else: 400), at most MaxBodyBytes long (413 Content Too Large), sent with
// Content-Type application/json or application/<name>+json, optionally with
// charset=utf-8. Any other Content-Type is 415 Unsupported Media Type, and
// so is a request without one: curl -d sends
// application/x-www-form-urlencoded unless told
// -H 'Content-Type: application/json'. Errors are problem documents
// (application/problem+json, RFC 9457) whose detail says what to change.
//
// POST /orders/{id}/cancel cancels an order and publishes
// order.order.cancelled.v1, whatever shipping did already, and answers
// 200 with the order, status "cancelled" (404 for an unknown order; a
// second cancel changes nothing). The other services compensate
// asynchronously: stock releases the reservations, billing voids the
// invoice, shipping cancels the preparation and, if a pickup was requested
// meanwhile, cancels it at the carrier. The order's fulfilment shows
// shipping's result: "cancelled" when no pickup had been requested, else
// "cancelling shipment", then "shipment cancelled". A cancel is never
// refused with 409 Conflict: the order service learns of the shipment
// through events, so it cannot know a cancel to be too late.
//
// GET /orders/{id} shows the order.
package order
