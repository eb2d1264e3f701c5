package shopkit

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/idem-go/idem/shop/store"
)

// Inspector reads every service's database of one namespace to check the
// shop's invariants.
type Inspector struct {
	// DBs are the services' databases, by service name.
	DBs map[string]*store.DB
	// OutboxRowsDeleted: the relays delete the outbox rows they published
	// (the CDC relay), so that a missing shipping event row is no missing
	// effect; a doubled one still is a problem.
	OutboxRowsDeleted bool
}

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

// Counts runs query, which selects a key and a count, on service's
// database and returns the counts by key.
func (in *Inspector) Counts(ctx context.Context, service, query string) (map[string]int, error) {
	rows, err := in.DBs[service].SQL.QueryContext(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", service, err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			return nil, err
		}
		out[k] = n
	}
	return out, rows.Err()
}

// State is what the databases hold, per order id.
type State struct {
	// Lines holds the committed orders: each one's number of lines.
	Lines                                                                        map[string]int
	reservations, preparations, prepEvents, shipments, pickups, invoices, emails map[string]int
	// cancelled holds the cancelled orders, whose pickup and e-mail may
	// never be made (cancelled before) and are checked for duplicates only.
	cancelled map[string]int
	// prepEventsDeleted: published outbox rows are deleted (Inspector's
	// OutboxRowsDeleted).
	prepEventsDeleted bool
}

// State reads what the databases hold.
func (in *Inspector) State(ctx context.Context) (State, error) {
	s := State{prepEventsDeleted: in.OutboxRowsDeleted}
	var err error
	q := []struct {
		dst          *map[string]int
		service, sql string
	}{
		{&s.Lines, "order", `SELECT order_id, count(*) FROM order_line GROUP BY order_id`},
		{&s.cancelled, "order", `SELECT id, 1 FROM orders WHERE status = 'cancelled'`},
		{&s.reservations, "stock", `SELECT order_id, count(*) FROM reservation GROUP BY order_id`},
		{&s.preparations, "shipping", `SELECT order_id, count(*) FROM preparation GROUP BY order_id`},
		{&s.prepEvents, "shipping", `SELECT aggregateid, count(*) FROM outbox WHERE type = 'shipping.preparation.created.v1' GROUP BY aggregateid`},
		{&s.shipments, "shipping", `SELECT order_id, count(*) FROM shipment GROUP BY order_id`},
		{&s.pickups, "carrier", `SELECT reference, count(*) FROM pickup GROUP BY reference`},
		{&s.invoices, "billing", `SELECT order_id, count(*) FROM invoice GROUP BY order_id`},
		{&s.emails, "carrier", `SELECT substr(idem_key, 9, length(idem_key) - 14), count(*) FROM email WHERE idem_key LIKE 'invoice:%:email' GROUP BY idem_key`},
	}
	for _, x := range q {
		if *x.dst, err = in.Counts(ctx, x.service, x.sql); err != nil {
			return s, err
		}
	}
	return s, nil
}

// Verdict checks the invariants: every committed order has exactly one
// reservation per line, one preparation, one pickup at the carrier, one
// invoice and one invoice e-mail (a cancelled order at most that many:
// cancelled early, it may have no pickup or e-mail); nothing exists for an
// order that was never committed. done is false while effects are still missing (not yet
// processed); problem is set when something is wrong for good (a
// duplicate, an orphan).
func (s State) Verdict() (done bool, problem string) {
	done = true
	var problems []string
	ids := make([]string, 0, len(s.Lines))
	for id := range s.Lines {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	check := func(id, what string, got, want int) {
		if s.cancelled[id] > 0 {
			want = min(got, want) // cancelled: at most want
		}
		switch {
		case got > want:
			problems = append(problems, fmt.Sprintf("order %s: %d %s, want %d", id, got, what, want))
		case got < want:
			done = false
		}
	}
	for _, id := range ids {
		check(id, "reservations", s.reservations[id], s.Lines[id])
		check(id, "preparations", s.preparations[id], 1)
		if s.prepEventsDeleted {
			check(id, "preparation.created events", s.prepEvents[id], min(s.prepEvents[id], 1))
		} else {
			check(id, "preparation.created events", s.prepEvents[id], 1)
		}
		check(id, "shipments", s.shipments[id], 1)
		check(id, "carrier pickups", s.pickups[id], 1)
		check(id, "invoices", s.invoices[id], 1)
		check(id, "invoice e-mails", s.emails[id], 1)
	}
	for what, m := range map[string]map[string]int{
		"reservation": s.reservations, "preparation": s.preparations, "pickup": s.pickups,
		"invoice": s.invoices, "e-mail": s.emails,
	} {
		for id := range m {
			if _, ok := s.Lines[id]; !ok {
				problems = append(problems, fmt.Sprintf("%s for order %s, which was never committed", what, id))
			}
		}
	}
	sort.Strings(problems)
	return done, strings.Join(problems, "; ")
}

// Settle polls until every committed order has all its effects, or a
// problem shows, or d passes. It returns a one-line observation and whether
// the invariants hold.
func (in *Inspector) Settle(ctx context.Context, d time.Duration, wantOrders int) (string, bool) {
	deadline := time.Now().Add(d)
	for {
		s, err := in.State(ctx)
		if err != nil {
			return "error: " + err.Error(), false
		}
		done, problem := s.Verdict()
		if problem != "" {
			return problem, false
		}
		if done && (wantOrders < 0 || len(s.Lines) == wantOrders) {
			// Give duplicates in flight a moment to show, then check again.
			time.Sleep(300 * time.Millisecond)
			s, err = in.State(ctx)
			if err != nil {
				return "error: " + err.Error(), false
			}
			if _, problem := s.Verdict(); problem != "" {
				return problem, false
			}
			return fmt.Sprintf("%d orders, each with 1 reservation per line, 1 preparation, 1 pickup, 1 invoice, 1 e-mail", len(s.Lines)), true
		}
		if time.Now().After(deadline) {
			incomplete := 0
			for id, n := range s.Lines {
				if s.cancelled[id] == 0 && s.reservations[id] < n || s.preparations[id] < 1 || s.pickups[id] < 1 || s.invoices[id] < 1 || s.emails[id] < 1 {
					incomplete++
				}
			}
			return fmt.Sprintf("after %v: %d orders (want %d), %d incomplete", d, len(s.Lines), wantOrders, incomplete), false
		}
		time.Sleep(100 * time.Millisecond)
	}
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
		row("nothing quarantined by a relay", quarantined, "0 outbox rows quarantined"),
	}
	if len(unmarkedIDs) > 0 {
		checks = append(checks, Check{What: "every invoice marked e-mailed",
			Observed: fmt.Sprintf("%d invoices not marked e-mailed (first: order %s)", len(unmarkedIDs), unmarkedIDs[0])})
	} else {
		checks = append(checks, Check{What: "every invoice marked e-mailed", Observed: "0 invoices left unmarked", OK: true})
	}
	return checks, nil
}

// processedAt renders processed_event.processed_at as text that sorts in
// time order, per dialect.
var processedAt = map[string]string{
	store.Postgres: `SELECT consumer_name, event_id, to_char(processed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') FROM processed_event`,
	store.MySQL:    `SELECT consumer_name, event_id, DATE_FORMAT(processed_at, '%Y-%m-%d %H:%i:%s.%f') FROM processed_event`,
	store.SQLite:   `SELECT consumer_name, event_id, processed_at FROM processed_event`,
}

// AppliedInOrder checks, from the databases, that every consumer applied
// the events of each aggregate in the order of their outbox rows (seq): a
// processed_event marker of an aggregate's later event never carries an
// earlier time than that of an earlier one. A marker's time is its
// transaction's start (PostgreSQL) or its insertion (SQLite, whose writers
// take turns): an event applied before an earlier one of its aggregate, by
// another replica or after a redelivery, shows. It needs the published
// rows, which the CDC relay deletes: then it says so and passes.
func (in *Inspector) AppliedInOrder(ctx context.Context) (Check, error) {
	c := Check{What: "every consumer applied each aggregate's events in order"}
	if in.OutboxRowsDeleted {
		c.OK, c.Observed = true, "not checked: the CDC relay deletes the published rows that give the order"
		return c, nil
	}
	type pos struct {
		aggregate string
		seq       int64
	}
	events := map[string]pos{}
	for _, service := range []string{"order", "shipping", "billing"} {
		rows, err := in.DBs[service].SQL.QueryContext(ctx, `SELECT id, aggregatetype, aggregateid, seq FROM outbox`)
		if err != nil {
			return c, fmt.Errorf("%s: %w", service, err)
		}
		for rows.Next() {
			var id, typ, agg string
			var seq int64
			if err := rows.Scan(&id, &typ, &agg, &seq); err != nil {
				rows.Close()
				return c, err
			}
			events[id] = pos{service + "/" + typ + "/" + agg, seq}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return c, err
		}
	}
	type applied struct {
		seq int64
		at  string
	}
	byKey := map[string][]applied{} // consumer + aggregate
	for _, service := range databases {
		db := in.DBs[service]
		rows, err := db.SQL.QueryContext(ctx, db.Pick(processedAt))
		if err != nil {
			return c, fmt.Errorf("%s: %w", service, err)
		}
		for rows.Next() {
			var consumer, id, at string
			if err := rows.Scan(&consumer, &id, &at); err != nil {
				rows.Close()
				return c, err
			}
			if p, ok := events[id]; ok {
				k := consumer + " " + p.aggregate
				byKey[k] = append(byKey[k], applied{p.seq, at})
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return c, err
		}
	}
	var checked, pairs int
	var problems []string
	for k, as := range byKey {
		if len(as) < 2 {
			continue
		}
		checked++
		sort.Slice(as, func(i, j int) bool { return as[i].seq < as[j].seq })
		for i := 1; i < len(as); i++ {
			pairs++
			if as[i].at < as[i-1].at {
				problems = append(problems, fmt.Sprintf("%s: row %d applied at %s, before row %d at %s", k, as[i].seq, as[i].at, as[i-1].seq, as[i-1].at))
			}
		}
	}
	sort.Strings(problems)
	switch {
	case len(problems) > 0:
		c.Observed = fmt.Sprintf("%d events applied before an earlier one of their aggregate (first: %s)", len(problems), problems[0])
	case checked == 0:
		c.Observed = "no consumer applied two events of one aggregate: nothing to compare"
	default:
		c.OK = true
		c.Observed = fmt.Sprintf("%d aggregates with several events, %d consecutive pairs, all in order", checked, pairs)
	}
	return c, nil
}
