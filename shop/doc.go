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
//   - shop/stock: reserves every line of a placed order, and releases the
//     reservations when the order is cancelled (consumer "stock").
//   - shop/shipping: creates one preparation per order (consumer
//     "shipping-preparation-v1") and asks the carrier for a pickup with the
//     stable key shipment:<order id>:initial (consumer "shipping-carrier-v1");
//     on a cancellation, cancels the preparation and any pickup, with the
//     key shipment:<order id>:cancel.
//   - shop/billing: one invoice per order, and its e-mail sent after commit
//     with the key invoice:<order id>:email (consumer "billing-mailer"); on
//     a cancellation, voids the invoice and, if it was e-mailed, says so with
//     the key invoice:<order id>:void-email.
//   - shop/carrier: a fake carrier and mail service that honours
//     idempotency keys and can be told to drop its answers.
//
// The shop command (cmd/shop) runs them, in one process or several. Built
// with the tag idemfault, as shopctl chaos runs it, each consumer also
// writes the application ledger (store.DB.RecordApplications): a row per
// event applied, in the consumer's transaction, that the chaos checker
// reads to find an event applied twice, lost or out of order.
//
// A cancel is always accepted and compensated: each service acts on
// order.order.cancelled.v1 idempotently, whatever it did already, rather
// than the order service refusing a cancel it cannot know to be too late
// (it learns of the shipment through events).
//
// # Input that can never succeed
//
// A consumer receives whatever was published, not only what the shop's own
// services wrote: a message typed by hand, another team's producer, an old
// version. Every handler starts with Decode, which reads the payload into
// its type and checks it with the type's Validate method, the same rules as
// the order API (ids, one to MaxLines lines, one line per product,
// quantities NormalizeQuantity accepts). A payload that breaks them is
// returned as idem.Permanent(err), err saying which field is wrong: the
// consumer parks the message in its failure store at once, without
// applying or retrying it, where "idem failed" shows it. Handlers of any
// idem application should do the same for input that retrying cannot fix,
// and return other errors as they are (retried), or wrapped with
// idem.Transient when a dependency is away for now.
package shop
