package shopkit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/idem-go/idem/internal/ctxsleep"
	"github.com/idem-go/idem/shop/order"
	"github.com/idem-go/idem/shop/store"
)

// Inspector reads every service's database of one namespace to check the
// shop's invariants.
type Inspector struct {
	// DBs are the services' databases, by service name.
	DBs map[string]*store.DB
	// API, when set, is the address (host:port) of the order API: Settle
	// then ends with a sentinel, an order placed and cancelled once every
	// effect is there, whose events follow every earlier one through the
	// relays and the queues; Settle waits until every consumer applied
	// them.
	API string
	// sentinels are the ids of the sentinel orders placed, which later
	// calls of Settle count among the orders they want.
	sentinels []string
}

// Sentinels returns the ids of the sentinel orders Settle placed.
func (in *Inspector) Sentinels() []string { return slices.Clone(in.sentinels) }

// OpenInspector opens the databases of the shop at dbURL (its --db) in
// namespace (its --namespace).
func OpenInspector(ctx context.Context, dbURL, namespace string) (*Inspector, error) {
	in := &Inspector{DBs: map[string]*store.DB{}}
	for _, s := range databases {
		db, err := store.Open(ctx, s, dbURL, namespace+"_"+s, store.Options{MaxConns: 2})
		if err != nil {
			in.Close()
			return nil, err
		}
		in.DBs[s] = db
	}
	return in, nil
}

// Close closes the databases.
func (in *Inspector) Close() {
	for _, db := range in.DBs {
		db.Close()
	}
}

// query runs q on service's database and calls scan for each row.
func (in *Inspector) query(ctx context.Context, service, q string, scan func(scan func(dst ...any) error) error) error {
	rows, err := in.DBs[service].SQL.QueryContext(ctx, q)
	if err != nil {
		return fmt.Errorf("%s: %w", service, err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows.Scan); err != nil {
			return fmt.Errorf("%s: %w", service, err)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("%s: %w", service, err)
	}
	return nil
}

// Counts runs query, which selects a key and a count, on service's
// database and returns the counts by key.
func (in *Inspector) Counts(ctx context.Context, service, query string) (map[string]int, error) {
	out := map[string]int{}
	err := in.query(ctx, service, query, func(scan func(...any) error) error {
		var k string
		var n int
		if err := scan(&k, &n); err != nil {
			return err
		}
		out[k] = n
		return nil
	})
	return out, err
}

// OrderState is what the databases hold for one order.
type OrderState struct {
	// Lines is the number of the order's lines; Status its status
	// (order.StatusConfirmed, order.StatusCancelled), Fulfilment and Rank
	// what the order service made of shipping's events.
	Lines      int
	Status     string
	Fulfilment string
	Rank       int
	// Reservations of its lines at stock, and how many are released.
	Reservations, Released int
	// Preparations at shipping, and how many are cancelled; Shipments
	// recorded by shipping, and how many are cancelled.
	Preparations, PreparationsCancelled int
	Shipments, ShipmentsCancelled       int
	// Pickups at the carrier, and how many are cancelled.
	Pickups, PickupsCancelled int
	// Invoices at billing, how many are voided, marked e-mailed, marked
	// told void; the e-mails the mail service sent for it.
	Invoices, Voided, EmailedMarks, VoidMarks int
	Emails, VoidEmails                        int
}

// State is what the databases hold, per order id.
type State struct {
	// Orders are the committed orders.
	Orders map[string]*OrderState
	// orphans are effects of orders that were never committed.
	orphans []string
}

// stateQueries read State: each selects an order id and counts, scanned
// into the fields that set returns.
var stateQueries = []struct {
	service, what, sql string
	fields             func(o *OrderState) []any
}{
	{"order", "orders", `SELECT o.id, o.status, o.fulfilment, o.fulfilment_rank, (SELECT count(*) FROM order_line l WHERE l.order_id = o.id) FROM orders o`,
		func(o *OrderState) []any { return []any{&o.Status, &o.Fulfilment, &o.Rank, &o.Lines} }},
	{"stock", "reservations", `SELECT order_id, count(*), count(released_at) FROM reservation GROUP BY order_id`,
		func(o *OrderState) []any { return []any{&o.Reservations, &o.Released} }},
	{"shipping", "preparations", `SELECT order_id, count(*), sum(CASE WHEN status = 'cancelled' THEN 1 ELSE 0 END) FROM preparation GROUP BY order_id`,
		func(o *OrderState) []any { return []any{&o.Preparations, &o.PreparationsCancelled} }},
	{"shipping", "shipments", `SELECT order_id, count(*), count(cancelled_at) FROM shipment GROUP BY order_id`,
		func(o *OrderState) []any { return []any{&o.Shipments, &o.ShipmentsCancelled} }},
	{"carrier", "pickups", `SELECT reference, count(*), count(cancelled_at) FROM pickup GROUP BY reference`,
		func(o *OrderState) []any { return []any{&o.Pickups, &o.PickupsCancelled} }},
	{"billing", "invoices", `SELECT order_id, count(*), count(voided_at), count(emailed_at), count(void_email_id) FROM invoice GROUP BY order_id`,
		func(o *OrderState) []any { return []any{&o.Invoices, &o.Voided, &o.EmailedMarks, &o.VoidMarks} }},
	{"carrier", "invoice e-mails", `SELECT substr(idem_key, 9, length(idem_key) - 14), count(*) FROM email WHERE idem_key LIKE 'invoice:%:email' GROUP BY idem_key`,
		func(o *OrderState) []any { return []any{&o.Emails} }},
	{"carrier", "void e-mails", `SELECT substr(idem_key, 9, length(idem_key) - 19), count(*) FROM email WHERE idem_key LIKE 'invoice:%:void-email' GROUP BY idem_key`,
		func(o *OrderState) []any { return []any{&o.VoidEmails} }},
}

// State reads what the databases hold.
func (in *Inspector) State(ctx context.Context) (State, error) {
	s := State{Orders: map[string]*OrderState{}}
	for i, q := range stateQueries {
		err := in.query(ctx, q.service, q.sql, func(scan func(...any) error) error {
			var id string
			var o OrderState
			if err := scan(append([]any{&id}, q.fields(&o)...)...); err != nil {
				return err
			}
			cur := s.Orders[id]
			if i == 0 {
				s.Orders[id] = &o
				return nil
			}
			if cur == nil {
				s.orphans = append(s.orphans, fmt.Sprintf("%s %s for order %s, which was never committed", q.service, q.what, id))
				return nil
			}
			dst, src := q.fields(cur), q.fields(&o)
			for j := range dst {
				*dst[j].(*int) = *src[j].(*int)
			}
			return nil
		})
		if err != nil {
			return s, err
		}
	}
	sort.Strings(s.orphans)
	return s, nil
}

// Verdict checks every committed order's effects, on every flow:
//
//   - every order: one reservation per line, one preparation, one invoice;
//   - a confirmed order: its preparation active, one shipment, one pickup
//     at the carrier, its invoice e-mailed once (and marked so), its
//     fulfilment at "shipment requested";
//   - a cancelled order: every reservation released, its preparation and
//     its invoice cancelled, at most one pickup, cancelled with its
//     shipment, at most one invoice e-mail and, when the invoice was
//     e-mailed, one e-mail saying it is void; its fulfilment at
//     "cancelled", or "shipment cancelled" when a pickup was cancelled;
//
// and nothing exists for an order that was never committed. done is false
// while effects are missing (not yet made); problem is set when something
// is wrong for good (a duplicate, an orphan); incomplete names the orders
// still missing an effect, with what they miss.
func (s State) Verdict() (done bool, problem string, incomplete []string) {
	var problems []string
	ids := make([]string, 0, len(s.Orders))
	for id := range s.Orders {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		o := s.Orders[id]
		var missing []string
		check := func(what string, got, want int) {
			switch {
			case got > want:
				problems = append(problems, fmt.Sprintf("order %s: %d %s, want %d", id, got, what, want))
			case got < want:
				missing = append(missing, fmt.Sprintf("%d of %d %s", got, want, what))
			}
		}
		atMost := func(what string, got, most int) {
			if got > most {
				problems = append(problems, fmt.Sprintf("order %s: %d %s, want at most %d", id, got, what, most))
			}
		}
		check("reservations", o.Reservations, o.Lines)
		check("preparations", o.Preparations, 1)
		check("invoices", o.Invoices, 1)
		if o.Status == order.StatusCancelled {
			// A pickup and an invoice e-mail exist if their request came
			// before the cancellation; then they are cancelled, and the
			// customer told.
			atMost("carrier pickups", o.Pickups, 1)
			atMost("invoice e-mails", o.Emails, 1)
			check("shipments", o.Shipments, o.Pickups)
			check("reservations released", o.Released, o.Reservations)
			check("preparations cancelled", o.PreparationsCancelled, o.Preparations)
			check("invoices voided", o.Voided, o.Invoices)
			check("pickups cancelled", o.PickupsCancelled, o.Pickups)
			check("shipments cancelled", o.ShipmentsCancelled, o.Shipments)
			check("void e-mails", o.VoidEmails, o.Emails)
			check("void e-mails recorded", o.VoidMarks, o.EmailedMarks)
			if o.Fulfilment != order.FulfilmentCancelled && o.Fulfilment != order.FulfilmentShipmentCancelled {
				missing = append(missing, "fulfilment "+o.Fulfilment)
			}
		} else {
			check("shipments", o.Shipments, 1)
			check("carrier pickups", o.Pickups, 1)
			check("invoice e-mails", o.Emails, 1)
			check("invoices marked e-mailed", o.EmailedMarks, o.Invoices)
			atMost("cancelled preparations", o.PreparationsCancelled, 0)
			atMost("voided invoices", o.Voided, 0)
			atMost("cancelled pickups", o.PickupsCancelled, 0)
			if o.Fulfilment != order.FulfilmentShipment {
				missing = append(missing, "fulfilment "+o.Fulfilment)
			}
		}
		if len(missing) > 0 {
			incomplete = append(incomplete, fmt.Sprintf("order %s (%s): %s", id, o.Status, strings.Join(missing, ", ")))
		}
	}
	problems = append(problems, s.orphans...)
	return len(incomplete) == 0, strings.Join(problems, "; "), incomplete
}

// settlePoll is how often Settle reads the databases.
const settlePoll = 250 * time.Millisecond

// settleStall is how long a settle goes on past its time while the
// consumers still apply events: on cores shared with other work a run
// that is slow, not stuck, ends complete; one in which no consumer
// applied anything for settleStall fails, as one that ran out of its
// time twice over.
const settleStall = 30 * time.Second

// SettleChecks waits, for d (and past it while consumers still apply
// events: settleStall, at most d more), until every committed order has all its
// effects (State.Verdict), wantOrders orders exist (unless it is
// negative; the sentinels of earlier calls are counted too) and, when the shop records its application ledger, every event
// of every outbox was applied by each consumer subscribed to it; then, with
// API set, it places a sentinel order, cancels it, and waits for the same
// again, the sentinel's events included: a copy of an earlier event still
// on its way (a redelivery, a republish) comes before the sentinel's in
// its queue. It returns the verdict's rows: the effects, then the
// ledger's (LedgerChecks). A duplicate or an orphan fails at once.
func (in *Inspector) SettleChecks(ctx context.Context, d time.Duration, wantOrders int) []Check {
	effects := Check{What: "every order: 1 reservation per line, 1 preparation, 1 pickup, 1 invoice, 1 e-mail; a cancelled one compensated everywhere; nothing for an order never committed"}
	start := time.Now()
	deadline := start.Add(d)
	applied, movedAt := -1, start // the ledgers' applications, and when they last grew
	sentinel := ""
	if wantOrders >= 0 {
		wantOrders += len(in.sentinels)
	}
	for {
		s, err := in.State(ctx)
		if err != nil {
			effects.Observed = "error: " + err.Error()
			return []Check{effects}
		}
		done, problem, incomplete := s.Verdict()
		if problem != "" {
			effects.Observed = problem
			return append([]Check{effects}, in.ledgerChecksOrError(ctx)...)
		}
		lp, err := in.ledgerProgress(ctx)
		if err != nil {
			effects.Observed = "error: " + err.Error()
			return []Check{effects}
		}
		if done && (wantOrders < 0 || len(s.Orders) == wantOrders) && lp.complete() {
			if in.API != "" && sentinel == "" {
				sentinel, err = PlaceSentinel(ctx, in.API)
				if sentinel != "" {
					in.sentinels = append(in.sentinels, sentinel)
				}
				if err != nil {
					effects.Observed = "the sentinel order: " + err.Error()
					return []Check{effects}
				}
				if wantOrders >= 0 {
					wantOrders++
				}
				continue
			}
			cancelled := 0
			for _, o := range s.Orders {
				if o.Status == order.StatusCancelled {
					cancelled++
				}
			}
			effects.OK = true
			effects.Observed = fmt.Sprintf("%d orders (%d cancelled), every effect there", len(s.Orders), cancelled)
			if sentinel != "" {
				effects.Observed += ", sentinel order applied by every consumer"
			}
			return append([]Check{effects}, in.ledgerChecksOrError(ctx)...)
		}
		if n := lp.applications(); n > applied {
			applied, movedAt = n, time.Now()
		}
		if now := time.Now(); now.After(deadline) && (now.Sub(movedAt) >= settleStall || now.After(deadline.Add(d))) {
			var parts []string
			if wantOrders >= 0 && len(s.Orders) != wantOrders {
				parts = append(parts, fmt.Sprintf("%d orders, want %d", len(s.Orders), wantOrders))
			}
			if len(incomplete) > 0 {
				parts = append(parts, fmt.Sprintf("%d orders incomplete (first: %s)", len(incomplete), incomplete[0]))
			}
			if m := lp.missing(); m != "" {
				parts = append(parts, "the ledgers against the outboxes: "+m)
			}
			if sentinel != "" {
				parts = append(parts, "sentinel order "+sentinel+" placed")
			}
			waited := fmt.Sprint(d)
			if over := time.Since(start) - d; over >= time.Second {
				waited = fmt.Sprintf("%v, and %v more while consumers still applied events (the last application %v before the end)",
					d, over.Round(time.Second), time.Since(movedAt).Round(time.Second))
			}
			effects.Observed = fmt.Sprintf("after %s: %s", waited, strings.Join(parts, "; "))
			return append([]Check{effects}, in.ledgerChecksOrError(ctx)...)
		}
		if !ctxsleep.Sleep(ctx, settlePoll) {
			effects.Observed = "error: " + ctx.Err().Error()
			return []Check{effects}
		}
	}
}

// ledgerChecksOrError is LedgerChecks, or one failed row with its error.
func (in *Inspector) ledgerChecksOrError(ctx context.Context) []Check {
	checks, err := in.LedgerChecks(ctx)
	if err != nil {
		return []Check{{What: "the application ledger", Observed: "error: " + err.Error()}}
	}
	return checks
}

// Settle is SettleChecks in one line: the observations, and whether every
// check passed or was not run.
func (in *Inspector) Settle(ctx context.Context, d time.Duration, wantOrders int) (string, bool) {
	checks := in.SettleChecks(ctx, d, wantOrders)
	var obs, failed []string
	for _, c := range checks {
		switch {
		case c.NotRun:
			obs = append(obs, "not run: "+c.What)
		case !c.OK:
			failed = append(failed, c.What+": "+c.Observed)
		default:
			obs = append(obs, c.Observed)
		}
	}
	if len(failed) > 0 {
		return strings.Join(failed, "; "), false
	}
	return strings.Join(obs, "; "), true
}

// PlaceSentinel places an order on the order API at addr and cancels it,
// retrying each request until it is accepted (30 s at most), and returns
// its id.
func PlaceSentinel(ctx context.Context, addr string) (string, error) {
	id, err := PlaceOK(ctx, addr, "sentinel", 1)
	if err != nil {
		return "", err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := PostJSON(ctx, "http://"+addr+"/orders/"+id+"/cancel", struct{}{})
		if err == nil {
			return id, nil
		}
		if time.Now().After(deadline) {
			return id, fmt.Errorf("cancel the sentinel order %s: %w", id, err)
		}
		if !ctxsleep.Sleep(ctx, 200*time.Millisecond) {
			return id, errors.Join(err, ctx.Err())
		}
	}
}

// archivedNotDeleted counts, per event name, the outbox rows that a CDC
// relay archived (published) and that are still in the outbox.
var archivedNotDeleted = map[string]string{
	store.Postgres: `SELECT o.type, count(*) FROM outbox o JOIN outbox_archive a ON a.id = o.id::text GROUP BY o.type`,
	store.MySQL:    `SELECT o.type, count(*) FROM outbox o JOIN outbox_archive a ON a.id = o.id GROUP BY o.type`,
}

// Leftovers checks what a run with faults only (kills, restarts, outages)
// must leave empty: the consumers' failure stores, the relays' quarantine,
// and the invoices not marked e-mailed (their e-mail sent, the mark lost).
// It returns one row per check.
func (in *Inspector) Leftovers(ctx context.Context) ([]Check, error) {
	var parked, quarantined []string
	for _, service := range databases {
		byConsumer, err := in.Counts(ctx, service, `SELECT consumer_name, count(*) FROM failed_message GROUP BY consumer_name`)
		if err != nil {
			return nil, err
		}
		for c, n := range byConsumer {
			parked = append(parked, fmt.Sprintf("%s: %d", c, n))
		}
		q, err := in.Counts(ctx, service, `SELECT type, count(*) FROM outbox WHERE quarantined_at IS NOT NULL GROUP BY type`)
		if err != nil {
			return nil, err
		}
		for name, n := range q {
			quarantined = append(quarantined, fmt.Sprintf("%s %s: %d", service, name, n))
		}
		if db := in.DBs[service]; db.Dialect != store.SQLite {
			// The CDC relays delete what they archive, in one statement: a
			// row still there was published before its transaction was
			// visible, and the delete did not see it (G13).
			left, err := in.Counts(ctx, service, db.Pick(archivedNotDeleted))
			if err != nil {
				return nil, err
			}
			for name, n := range left {
				quarantined = append(quarantined, fmt.Sprintf("%s %s: %d published and archived, still in the outbox", service, name, n))
			}
		}
	}
	sort.Strings(parked)
	sort.Strings(quarantined)
	unmarked, err := in.Counts(ctx, "billing", `SELECT order_id, 1 FROM invoice WHERE emailed_at IS NULL AND voided_at IS NULL`)
	if err != nil {
		return nil, err
	}
	row := func(what string, problems []string, none string) Check {
		if len(problems) == 0 {
			return Check{What: what, Observed: none, OK: true}
		}
		return Check{What: what, Observed: strings.Join(problems, "; ")}
	}
	var unmarkedIDs []string
	for id := range unmarked {
		unmarkedIDs = append(unmarkedIDs, id)
	}
	sort.Strings(unmarkedIDs)
	checks := []Check{
		row("nothing parked by a consumer", parked, "0 messages in the failure stores"),
		row("nothing quarantined or left behind by a relay", quarantined, "0 outbox rows quarantined, 0 archived rows left in an outbox"),
	}
	if len(unmarkedIDs) > 0 {
		checks = append(checks, Check{What: "every invoice marked e-mailed",
			Observed: fmt.Sprintf("%d invoices not marked e-mailed (first: order %s)", len(unmarkedIDs), unmarkedIDs[0])})
	} else {
		checks = append(checks, Check{What: "every invoice marked e-mailed", Observed: "0 invoices left unmarked", OK: true})
	}
	return checks, nil
}
