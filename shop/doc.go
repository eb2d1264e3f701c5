// Package shop holds the contracts of the reference application: the event
// names and payloads that its services (order, stock, shipping, billing)
// exchange through their outboxes and the broker.
//
// The application itself lives in the subpackages, one per service, each with
// its own database:
//
//   - shop/order: the HTTP API that places and cancels orders, writing the
//     order and its event in one transaction, with Idempotency-Key support;
//     it also consumes shipping's events to show the fulfilment.
//   - shop/stock: reserves every line of a placed order (consumer "stock").
//   - shop/shipping: creates one preparation per order (consumer
//     "shipping-preparation-v1") and asks the carrier for a pickup with the
//     stable key shipment:<order id>:initial (consumer "shipping-carrier-v1").
//   - shop/billing: one invoice per order, and its e-mail sent after commit
//     with the key invoice:<order id>:email (consumer "billing-mailer").
//   - shop/carrier: a fake carrier and mail service that honours
//     idempotency keys and can be told to drop its answers.
//
// The shop command (cmd/shop) runs them, in one process or several.
package shop
