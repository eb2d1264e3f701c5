// Package dashboard serves idem's web dashboard: an http.Handler that shows
// what "idem status" prints, with small charts of the last hour, and the
// parked messages of each database's failure store, which an operator can
// read byte for byte, retry or remove.
//
// The pages are rendered on the server (html/template, inline SVG charts,
// no JavaScript) from embedded templates and style sheet. Per database, the
// overview shows the outbox backlog, the age of the oldest unpublished row,
// the last publish and the quarantined rows; per consumer, its last
// processed event, how many it processed in the last minute, its parked
// messages, what waits for it in the broker when the broker can tell, and
// the p50 and p99 of its commit-to-handle delay when Config.Gatherer holds
// idem_consumer_commit_to_handle_seconds. The parked messages are listed
// with filters (database, consumer, event name, source, since, held by),
// sorted first into groups by consumer and cause (as "idem failed groups"),
// and shown one by one: body as text, or a hex dump when it is not text,
// headers, error history, attempts, aggregate, and the message it is held
// behind.
//
// Retry re-drives a message exactly as "idem failed retry" does
// (inbox.FailureStore.Retry, through Config.Redeliverer); remove deletes it.
// "Retry all" and "remove all" do the same for every message of a group,
// or of a consumer, as "idem failed retry|remove --group|--all" do.
// Each action has a confirmation page, is POSTed with a CSRF token tied to
// a cookie, is refused from another origin, and is logged on
// Config.Logger: who, from where, what, which message, and the result.
// Config.ReadOnly hides and refuses them. With Config.Token or
// Config.BasicAuth every request must authenticate.
//
//	d, err := dashboard.New(dashboard.Config{
//		Databases: []dashboard.Database{{
//			Name:   "stock",
//			Store:  postgres.NewPgx(pool),
//			Source: monitor.New(postgres.NewPgx(pool), monitor.Options{Name: "stock"}),
//		}},
//		Redeliverer: publisher, // *amqp.Publisher, *kafka.Publisher, *nats.Publisher
//		Path:        "/dashboard/",
//	})
//	if err != nil { ... }
//	if err := d.Start(ctx); err != nil { ... } // samples for the charts
//	defer d.Stop(context.Background())
//	mux.Handle("/dashboard/", d)
//
// "idem dashboard" serves it on its own; the shop mounts it on its admin
// address.
package dashboard
