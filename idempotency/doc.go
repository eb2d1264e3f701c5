// Package idempotency makes requests safe to retry at both ends of a
// service: the Idempotency-Key header of the requests it receives (IETF
// httpapi draft "The Idempotency-Key HTTP Header Field"), and stable keys
// for the calls it makes to other services.
//
// # Incoming requests
//
// A client that times out does not know whether its request took effect.
// It retries with the same Idempotency-Key, and the server must answer the
// retry with the first response instead of doing the work twice. Keys
// stores the keys in the idempotent_request table, which idem's migration
// 0004 creates (idem migrate up), on any idem dialect: PostgreSQL (pgx or
// database/sql), MySQL/MariaDB, SQLite.
//
//	keys, err := idempotency.New(drv, idempotency.Config{TTL: 24 * time.Hour})
//	mux.Handle("POST /orders", keys.Middleware(http.HandlerFunc(placeOrder)))
//	purger := keys.NewPurger() // deletes expired keys, every 10 minutes
//	err = purger.Start(ctx)
//	defer purger.Stop(ctx)
//
// The middleware claims the key before the handler runs, in a statement
// committed at once, so that a concurrent retry sees it: that retry gets
// 409 Conflict (with Retry-After) while the first request runs, the stored
// response once it completed (with Idempotent-Replayed: true), and 422 if
// it sent another request with the key. A request's fingerprint is its
// method, its path and query, and the exact bytes of its body (see
// Fingerprint): a retry must send the same bytes. Keys are forgotten after
// Config.TTL. A request whose process crashed leaves its key processing;
// after Config.LockTimeout, a retry takes it over and runs.
//
// The handler completes the key in its own transaction, so that the
// business rows, the outbox events and the response to replay commit
// together, or not at all:
//
//	func placeOrder(w http.ResponseWriter, r *http.Request) {
//		tx, _ := db.BeginTx(r.Context(), nil)
//		defer tx.Rollback()
//		// ... insert the order, outbox.Add the event ...
//		resp := idempotency.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
//		if err := keys.Complete(r.Context(), tx, idempotency.ClaimFrom(r.Context()), resp); err != nil {
//			// idempotency.ErrClaimLost: a retry took the key over; answer 409
//		}
//		if err := tx.Commit(); err != nil { ... }
//		resp.Send(w)
//	}
//
// A handler that answers an error without completing its key releases it:
// the middleware deletes the claim, and the retry runs at once. A handler
// without database effects of its own need not complete anything: the
// middleware records its 2xx response after sending it.
//
// Claim, Complete and Release are the steps the middleware takes, for
// other protocols than HTTP.
//
// # One transaction per request
//
// The middleware costs three commits for a request: the claim, the
// handler's transaction, and for a handler that does not complete its key
// the recording of its response. When every effect of a handler is in the
// key's database, TxHandler does it in one: it begins the transaction,
// claims the key in it (ClaimTx), runs the handler in it, and stores a 2xx
// response with the key before the commit.
//
//	mux.Handle("POST /orders", keys.TxHandler(func(ctx context.Context, tx *sql.Tx, r *http.Request) (idempotency.Response, error) {
//		// ... insert the order, outbox.Add the event, in tx ...
//		return idempotency.Response{Status: 201, Header: hdr, Body: body}, nil
//	}))
//
// The key is locked until the transaction ends (PostgreSQL: an advisory
// lock on the key's hash; MySQL/MariaDB: the row its insert writes;
// SQLite: the database's write lock), so a concurrent retry waits for the
// first request, up to Config.LockWait, and is answered its response,
// where the middleware answers 409 at once. A crash rolls everything back,
// the claim with it: the retry runs at once, with no lock timeout to wait.
// Another response than 2xx, or an error, rolls back and leaves no key.
// ClaimTx is the same step inside a transaction of the caller's.
//
// # Outgoing calls
//
// A call with an effect outside the database (a carrier's pickup, an
// e-mail) cannot be rolled back with a transaction, and its answer can be
// lost after the remote did the work. Do sends it with a stable key, the
// same at every attempt ("shipment:42:initial", see StableKey), so that
// the remote does the work once; when the answer is lost (a transport
// error or a 5xx, not a refusal), it first looks the effect up by
// reference, then sends again with the same key:
//
//	pickup, err := idempotency.Do(ctx, idempotency.Call[Pickup]{
//		Key:    idempotency.StableKey("shipment", orderID, "initial"),
//		Send:   func(ctx context.Context, key string) (Pickup, error) { return carrier.Request(ctx, orderID, key) },
//		Lookup: func(ctx context.Context) (Pickup, bool, error) { return carrier.Find(ctx, orderID) },
//	})
//
// Send's errors say what a retry can do, as an inbox handler's must:
// ClassifyStatus and ClassifyTransport wrap HTTP failures with
// idem.Transient (the remote is away: the consumer pauses and retries
// without counting attempts) or idem.Permanent (the remote refused: the
// message is parked).
package idempotency
