// Package webhookin receives webhooks (a payment provider's, a carrier's,
// another idem's) into an idempotent consumer: a Handler is an
// http.Handler that verifies the sender's signature, turns the request
// into a message and hands it to an inbox.Consumer, whose handlers apply
// the event once, in the consumer's transaction, with its marker in
// processed_event, however often the sender delivers it.
//
//	payments, _ := inbox.New(drv, inbox.Config{Name: "stripe"})
//	payments.Handle("payment_intent.succeeded", func(ctx context.Context, tx *sql.Tx, ev idem.Event) error {
//		... // mark the order paid, with tx
//	})
//	h, _ := webhookin.New(payments, webhookin.Config{
//		Provider: webhookin.Stripe{Secrets: []string{os.Getenv("STRIPE_WEBHOOK_SECRET")}},
//	})
//	mux.Handle("POST /webhooks/stripe", h)
//
// # From a request to an event
//
// The Provider verifies the signature over the body exactly as received
// (StandardWebhooks, Stripe, GitHub, or a scheme of your own: two methods)
// and says where the event's id and type are. The message handed to the
// consumer is the request: its body as it is, its headers (names in lower
// case; Authorization, Proxy-Authorization and Cookie left out), plus the
// headers "id" (the sender's event id) and "eventType" (its type), which
// the consumer's decoder reads as it reads a Debezium record: the event id
// is idem.EventID of the sender's id, the sender's id itself when it is a
// UUID (GitHub's X-GitHub-Delivery), else its name-based UUID, the
// sender's id kept in the header idem-original-id (Stripe's evt_...,
// Standard Webhooks' msg_...); the event name is the type; the payload is
// the body, which must be JSON. A body that is an idem envelope (what
// broker/webhook sends in its mode PerMessage) is read as one, and a
// CloudEvent (Content-Type application/cloudevents+json, or ce- headers)
// as one, its id then being the CloudEvent's. Give each
// sender a consumer name of its own (inbox.Config.Name): ids are unique per
// sender only.
//
// # Answers
//
// The handler answers once the consumer's transaction has committed or
// rolled back, never before: a 2xx means the event is applied, was
// applied, needs nothing, or is parked where an operator sees it; anything
// else means nothing was kept and the sender should try again. Senders
// retry on anything but a 2xx, for days (Stripe, Standard Webhooks), so
// what will never succeed is parked and acknowledged rather than refused,
// and what may succeed later is answered 5xx with Retry-After:
//
//	request                                            status                         stored
//	not a POST                                         405                            nothing
//	body over Config.MaxBodyBytes                      413                            nothing (the signature cannot be checked)
//	signature missing or wrong, timestamp out of       401                            nothing
//	  tolerance (a replay)
//	applied                                            200 {"outcome":"applied"}      effects and marker, committed
//	duplicate (applied before, or concurrently)        200 {"outcome":"duplicate"}    nothing new
//	no handler for its type                            200 {"outcome":"ignored"}      nothing
//	event unreadable (no id or type, body not JSON),   202 {"outcome":"parked"}       the request, in the failure store
//	  handler error wrapped with idem.Permanent, or
//	  its attempts exhausted
//	handler error, attempts left (inbox.RetryPolicy)   500 + Retry-After              the attempt count
//	transient: the consumer's database away, a         503 + Retry-After              nothing (never parked for it)
//	  handler's idem.Transient, the delivery's timeout
//
// Two deliveries of one event at once are ordered by processed_event's
// primary key, as two workers of a consumer are: the second waits for the
// first's transaction, then is a duplicate (or, if the first rolled back,
// applies the event). The consumer's work is not cancelled when the sender
// hangs up: it ends within inbox.Config.DeliveryTimeout (30s; keep it below
// the sender's own timeout, GitHub's is 10s), and a commit the sender did
// not see makes its retry a duplicate.
//
// A transient failure is retried by the sender: the consumer counts it as
// an attempt only once the event has failed transiently for longer than
// inbox.Config.OutageBudget (10m) in this process; set the budget to the
// sender's retry span (three days for Stripe) for a dependency away that
// long to never park an event.
//
// # Parked requests
//
// A parked request is in the consumer's failure store, byte for byte, with
// its headers and the source Handler.Source ("webhook:<consumer name>"):
// "idem failed list", "show", "groups" and "remove" work on it, and the
// dashboard shows it. It is re-driven in the application, which holds the
// handlers: the Handler is a broker.Redeliverer that hands the message to
// the consumer again (without checking a signature whose timestamp is old
// by then), so that inbox.FailureStore.Retry(ctx, handler, m, nil), and a
// dashboard mounted in the application with Config.Redeliverer set to the
// handler (Handlers for several), retry it; the consumer removes the entry
// once the event is applied. "idem failed retry", which re-drives through
// a broker from another process, refuses these messages and says so.
package webhookin
