// Package order is the shop's order service: an HTTP API that places and
// cancels orders, and a consumer of shipping's events that shows each
// order's fulfilment.
//
// POST /orders writes the order, its lines and the order.order.placed.v1
// outbox event in one transaction, and answers 201 Created with the order
// and its path in Location (/orders/{id}): status "confirmed", fulfilment
// "awaiting preparation" until shipping's events say more. The request may
// carry an Idempotency-Key header (see
// the IETF httpapi draft "The Idempotency-Key HTTP Header Field"), handled
// by idem's package idempotency: the order's transaction claims the key
// (idempotency.Keys.TxHandler), so that the claim, the order, its event and
// the response to replay commit together, one commit per order. Keys live in idem's
// idempotent_request table (version 2 of the service's migrations moved
// them there from its own idempotency_key table):
//
//   - the same key with the same body replays the stored response, its
//     Location included, with the header Idempotent-Replayed: true;
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
// -H 'Content-Type: application/json'.
//
// The order is {"customer_id":"c-7","lines":[{"product_id":"p-1",
// "quantity":"2.000"}]}: the body is walked token by token before it is
// decoded, and refused with 400 when
//
//   - a member appears twice, at any depth ("lines[1].product_id appears
//     twice"): names compare after unescaping, so "customer\u005fid" is
//     customer_id. A decoder would keep the last copy, and two retries of
//     one order differing only in the copy they put last would be two
//     fingerprints for the Idempotency-Key;
//   - a member is unknown, or a known one is spelt in another case
//     ("Customer_ID"): member names are case-sensitive;
//   - a value has the wrong type: the detail gives its path and what is
//     expected: lines[0].quantity must be a string such as "2.000", not a
//     number. Quantities are decimal strings, never JSON numbers.
//
// Errors are problem documents (application/problem+json, RFC 9457) whose
// detail says what to change in the request's own terms, every one of
// them: a path the API does not have is 404 Not Found, another method on
// one of its paths is 405 Method Not Allowed with an Allow header (GET
// /orders, DELETE /orders/{id}). Handler answers every path: mount it at
// "/" beside handlers with paths of their own.
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
