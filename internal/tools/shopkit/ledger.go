package shopkit

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/idem-go/idem/shop"
	"github.com/idem-go/idem/shop/billing"
	"github.com/idem-go/idem/shop/order"
	"github.com/idem-go/idem/shop/shipping"
	"github.com/idem-go/idem/shop/stock"
	"github.com/idem-go/idem/shop/store"
)

// consumerDB maps each consumer of the shop to its service, whose database
// holds its application ledger (store.DB.RecordApplications).
var consumerDB = map[string]string{
	order.ConsumerName:           "order",
	stock.ConsumerName:           "stock",
	shipping.PreparationConsumer: "shipping",
	shipping.CarrierConsumer:     "shipping",
	billing.InvoiceConsumer:      "billing",
	billing.MailerConsumer:       "billing",
}

// subscribers maps each event name of the shop to the consumers that
// handle it (a test checks it against the services' handlers). The event
// comes from the outbox of the service its name begins with.
var subscribers = map[string][]string{
	shop.OrderPlaced:          {stock.ConsumerName, shipping.PreparationConsumer, billing.InvoiceConsumer},
	shop.OrderCancelled:       {stock.ConsumerName, shipping.PreparationConsumer, billing.InvoiceConsumer},
	shop.PreparationCreated:   {shipping.CarrierConsumer, order.ConsumerName},
	shop.PreparationCancelled: {shipping.CarrierConsumer, order.ConsumerName},
	shop.ShipmentRequested:    {order.ConsumerName},
	shop.ShipmentCancelled:    {order.ConsumerName},
	shop.InvoiceCreated:       {billing.MailerConsumer},
	shop.InvoiceVoided:        {billing.MailerConsumer},
}

// producers are the services with an outbox.
var producers = []string{"order", "shipping", "billing"}

// ledgerServices are the services whose databases hold a ledger.
var ledgerServices = []string{"order", "stock", "shipping", "billing"}

// outboxCounts counts, per event name, the events an outbox holds: its rows
// not quarantined, and on the dialects with a CDC relay the archive of what
// that relay published (and deleted from the table), each event once.
var outboxCounts = map[string]string{
	store.Postgres: `SELECT type, count(*) FROM (SELECT id::text AS id, type FROM outbox WHERE quarantined_at IS NULL
UNION SELECT id, type FROM outbox_archive) t GROUP BY type`,
	store.MySQL: `SELECT type, count(*) FROM (SELECT id, type FROM outbox WHERE quarantined_at IS NULL
UNION SELECT id, type FROM outbox_archive) t GROUP BY type`,
	store.SQLite: `SELECT type, count(*) FROM outbox WHERE quarantined_at IS NULL GROUP BY type`,
}

// outboxEvents reads the events an outbox holds, as outboxCounts counts
// them.
var outboxEvents = map[string]string{
	store.Postgres: `SELECT id::text, type, aggregatetype, aggregateid, aggregate_version FROM outbox WHERE quarantined_at IS NULL
UNION ALL SELECT id, type, aggregatetype, aggregateid, aggregate_version FROM outbox_archive`,
	store.MySQL: `SELECT id, type, aggregatetype, aggregateid, aggregate_version FROM outbox WHERE quarantined_at IS NULL
UNION ALL SELECT id, type, aggregatetype, aggregateid, aggregate_version FROM outbox_archive`,
	store.SQLite: `SELECT id, type, aggregatetype, aggregateid, aggregate_version FROM outbox WHERE quarantined_at IS NULL`,
}

// ledgerProgress is how far the consumers are: per consumer, the events
// its producers hold for it and the events its ledger has, both counted.
type ledgerProgress struct {
	// recorded is false when no ledger has any row: the shop does not
	// record it (a build without idemfault), and nothing can be counted.
	recorded          bool
	expected, applied map[string]int
}

// applications counts the events applied by every consumer.
func (lp ledgerProgress) applications() int {
	n := 0
	for _, a := range lp.applied {
		n += a
	}
	return n
}

// complete reports whether every consumer applied as many events as its
// producers hold for it (or the ledger is not recorded).
func (lp ledgerProgress) complete() bool {
	return lp.missing() == ""
}

// missing says, per consumer, how many events it has not applied, and how
// many it applied that its producers do not hold yet: a CDC relay archives
// a WAL message (no outbox row) once the broker confirmed it, and a
// consumer may apply it before. Until the archive has them, the ledgers
// cannot be checked against the outboxes.
func (lp ledgerProgress) missing() string {
	if !lp.recorded {
		return ""
	}
	var out []string
	consumers := slices.Sorted(maps.Keys(lp.expected))
	for _, c := range slices.Sorted(maps.Keys(lp.applied)) {
		if _, ok := lp.expected[c]; !ok {
			consumers = append(consumers, c)
		}
	}
	for _, c := range consumers {
		switch n := lp.expected[c] - lp.applied[c]; {
		case n > 0:
			out = append(out, fmt.Sprintf("%s %d not applied", c, n))
		case n < 0:
			out = append(out, fmt.Sprintf("%s %d applied that no outbox holds yet", c, -n))
		}
	}
	return strings.Join(out, ", ")
}

// ledgerProgress counts, with a few aggregate queries, what the consumers
// have left to apply.
func (in *Inspector) ledgerProgress(ctx context.Context) (ledgerProgress, error) {
	lp := ledgerProgress{expected: map[string]int{}, applied: map[string]int{}}
	for _, s := range producers {
		counts, err := in.Counts(ctx, s, in.DBs[s].Pick(outboxCounts))
		if err != nil {
			return lp, err
		}
		for name, n := range counts {
			for _, c := range subscribers[name] {
				lp.expected[c] += n
			}
		}
	}
	for _, s := range ledgerServices {
		counts, err := in.Counts(ctx, s, `SELECT consumer_name, count(DISTINCT event_id) FROM applied_event GROUP BY consumer_name`)
		if err != nil {
			return lp, err
		}
		for c, n := range counts {
			lp.applied[c] += n
			lp.recorded = true
		}
	}
	return lp, nil
}

// outboxEvent is an event of an outbox.
type outboxEvent struct {
	outbox, name, aggregate string
	version                 int64
}

// application is a row of a ledger.
type application struct {
	seq                          int64
	consumer, eventID, name, agg string
	version                      int64
}

// outboxEvents reads the events of every outbox, by id.
func (in *Inspector) outboxEvents(ctx context.Context) (map[string]outboxEvent, error) {
	events := map[string]outboxEvent{}
	for _, s := range producers {
		err := in.query(ctx, s, in.DBs[s].Pick(outboxEvents), func(scan func(...any) error) error {
			var id, name, aggType, aggID string
			var version int64
			if err := scan(&id, &name, &aggType, &aggID, &version); err != nil {
				return err
			}
			events[strings.ToLower(id)] = outboxEvent{outbox: s, name: name, aggregate: aggType + " " + aggID, version: version}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return events, nil
}

// applications reads every ledger, in no particular order.
func (in *Inspector) applications(ctx context.Context) ([]application, error) {
	var apps []application
	for _, s := range ledgerServices {
		err := in.query(ctx, s, `SELECT seq, consumer_name, event_id, event_name, aggregate_type, aggregate_id, aggregate_version FROM applied_event`, func(scan func(...any) error) error {
			var a application
			var aggType, aggID string
			if err := scan(&a.seq, &a.consumer, &a.eventID, &a.name, &aggType, &aggID, &a.version); err != nil {
				return err
			}
			a.eventID, a.agg = strings.ToLower(a.eventID), aggType+" "+aggID
			apps = append(apps, a)
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return apps, nil
}

// AppliedEverywhere returns the ids of the events of every outbox that
// each consumer subscribed to them has applied: copies of them published
// again can only be duplicates, whatever their order.
func (in *Inspector) AppliedEverywhere(ctx context.Context) (map[string]bool, error) {
	events, err := in.outboxEvents(ctx)
	if err != nil {
		return nil, err
	}
	apps, err := in.applications(ctx)
	if err != nil {
		return nil, err
	}
	applied := map[[2]string]bool{}
	for _, a := range apps {
		applied[[2]string{a.consumer, a.eventID}] = true
	}
	out := map[string]bool{}
	for id, ev := range events {
		all := true
		for _, c := range subscribers[ev.name] {
			all = all && applied[[2]string{c, id}]
		}
		if all {
			out[id] = true
		}
	}
	return out, nil
}

// LedgerChecks reads every outbox and every consumer's application ledger
// and checks, for every consumer and every flow (cancellations and the
// order service's own consumer included):
//
//   - exactly once: no event applied twice by one consumer, whatever caps
//     its effects (a unique key, the handler's own idempotence);
//   - nothing lost: every event of every outbox applied by each consumer
//     subscribed to it, and no event applied that no outbox holds;
//   - order: each consumer applied each aggregate's events in the order of
//     their aggregate versions (a version is never applied after a higher
//     one of its aggregate).
//
// A check that cannot run (no ledger recorded; no aggregate with two
// versioned events) is returned with NotRun, never as a pass.
func (in *Inspector) LedgerChecks(ctx context.Context) ([]Check, error) {
	once := Check{What: "exactly once: no event applied twice by any consumer (application ledger)"}
	lost := Check{What: "nothing lost: every event of every outbox applied by each consumer subscribed to it"}
	ordered := Check{What: "order: every consumer applied each aggregate's events in aggregate-version order"}
	events, err := in.outboxEvents(ctx)
	if err != nil {
		return nil, err
	}
	apps, err := in.applications(ctx)
	if err != nil {
		return nil, err
	}
	if len(apps) == 0 {
		why := "no application recorded: the shop writes its application ledger (applied_event) only when built with -tags idemfault"
		if len(events) == 0 {
			why = "no event in any outbox"
		}
		for _, c := range []*Check{&once, &lost, &ordered} {
			c.NotRun, c.Observed = true, why
		}
		return []Check{once, lost, ordered}, nil
	}
	// Each consumer's applications in the order they were written: seq
	// orders the rows of one database, and a consumer's ledger is in one.
	sort.SliceStable(apps, func(i, j int) bool { return apps[i].seq < apps[j].seq })

	// Exactly once.
	count := map[[2]string]int{}
	for _, a := range apps {
		count[[2]string{a.consumer, a.eventID}]++
	}
	var dups []string
	for _, a := range apps {
		k := [2]string{a.consumer, a.eventID}
		if n := count[k]; n > 1 {
			dups = append(dups, fmt.Sprintf("%s applied %s %s (%s v%d) %d times", a.consumer, a.name, a.eventID, a.agg, a.version, n))
			count[k] = 0
		}
	}
	once.OK = len(dups) == 0
	once.Observed = fmt.Sprintf("%d applications by %d consumers, each event once", len(apps), countConsumers(apps))
	if !once.OK {
		once.Observed = fmt.Sprintf("%d events applied more than once: %s", len(dups), firstOf(dups, 3))
	}

	// Nothing lost, nothing from nowhere.
	var missing, unknown []string
	for id, ev := range events {
		for _, c := range subscribers[ev.name] {
			if _, ok := count[[2]string{c, id}]; !ok {
				missing = append(missing, fmt.Sprintf("%s never applied %s %s (%s v%d) of the %s outbox", c, ev.name, id, ev.aggregate, ev.version, ev.outbox))
			}
		}
	}
	for _, a := range apps {
		if _, ok := events[a.eventID]; !ok {
			unknown = append(unknown, fmt.Sprintf("%s applied %s %s, which no outbox holds", a.consumer, a.name, a.eventID))
		}
	}
	sort.Strings(missing)
	sort.Strings(unknown)
	switch {
	case len(missing) > 0:
		lost.Observed = fmt.Sprintf("%d applications lost: %s", len(missing), firstOf(missing, 3))
	case len(unknown) > 0:
		lost.Observed = fmt.Sprintf("%d applications of events no outbox holds: %s", len(unknown), firstOf(unknown, 3))
	default:
		lost.OK = true
		lost.Observed = fmt.Sprintf("%d events in %d outboxes, each applied by every subscribed consumer", len(events), len(producers))
	}

	// Order: per consumer and aggregate, the first application of each
	// event, in ledger order, has a higher version than every one before.
	type key struct{ consumer, agg string }
	seen := map[[2]string]bool{}
	byAgg := map[key][]application{}
	unversioned := 0
	for _, a := range apps {
		k := [2]string{a.consumer, a.eventID}
		if seen[k] {
			continue
		}
		seen[k] = true
		if a.version <= 0 {
			unversioned++
			continue
		}
		ka := key{a.consumer, a.agg}
		byAgg[ka] = append(byAgg[ka], a)
	}
	var swaps []string
	aggs, pairs := 0, 0
	for k, as := range byAgg {
		if len(as) < 2 {
			continue
		}
		aggs++
		highest := as[0]
		for _, a := range as[1:] {
			pairs++
			if a.version <= highest.version {
				swaps = append(swaps, fmt.Sprintf("%s applied %s (v%d) after %s (v%d) of %s", k.consumer, a.name, a.version, highest.name, highest.version, k.agg))
			} else {
				highest = a
			}
		}
	}
	sort.Strings(swaps)
	switch {
	case len(swaps) > 0:
		ordered.Observed = fmt.Sprintf("%d events applied after a later one of their aggregate: %s", len(swaps), firstOf(swaps, 3))
	case aggs == 0:
		ordered.NotRun = true
		ordered.Observed = "no consumer applied two versioned events of one aggregate: nothing to compare"
	default:
		ordered.OK = true
		ordered.Observed = fmt.Sprintf("%d aggregates with several events at a consumer, %d consecutive pairs, all in version order", aggs, pairs)
	}
	if unversioned > 0 {
		ordered.Observed += fmt.Sprintf(" (%d applications of events without a version not compared)", unversioned)
	}
	return []Check{once, lost, ordered}, nil
}

func countConsumers(apps []application) int {
	seen := map[string]bool{}
	for _, a := range apps {
		seen[a.consumer] = true
	}
	return len(seen)
}

// firstOf joins the first n of items, saying how many more there are.
func firstOf(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, "; ")
	}
	return strings.Join(items[:n], "; ") + fmt.Sprintf("; and %d more", len(items)-n)
}
