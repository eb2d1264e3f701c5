package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/outbox"
)

// TestFailedGroups parks messages of a few causes on every dialect, then
// lists them in groups, retries one group (exactly its messages are re-driven
// and applied) and removes another (exactly its messages go); then the same
// for the relay's quarantine.
func TestFailedGroups(t *testing.T) {
	t.Parallel()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		pg := testdb.NewPostgres(t)
		failedGroups(t, &quarantineDB{dialect: "postgres", url: pg.URL, db: pg.DB, drv: postgres.NewSQL(pg.DB)})
	})
	t.Run("mariadb", func(t *testing.T) {
		t.Parallel()
		m := testdb.NewMariaDB(t)
		failedGroups(t, &quarantineDB{dialect: "mysql", url: m.URL, db: m.DB, drv: m.Driver})
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		s := testdb.NewSQLite(t)
		failedGroups(t, &quarantineDB{dialect: "sqlite", url: "sqlite:" + s.URL, db: s.DB, drv: s.Driver})
	})
}

// jsonGroup is a group as "idem failed groups --json" prints it.
type jsonGroup struct {
	ID, Consumer, Class, Cause, Example string
	Count                               int
	FirstFailed                         time.Time `json:"first_failed"`
	LastFailed                          time.Time `json:"last_failed"`
}

func groupsJSON(t *testing.T, env map[string]string, args ...string) map[string]jsonGroup {
	t.Helper()
	code, out, errOut := idem(t, env, "", append([]string{"failed", "groups", "--json"}, args...)...)
	if code != 0 {
		t.Fatalf("failed groups --json %v = %d\n%s%s", args, code, out, errOut)
	}
	var gs []jsonGroup
	if err := json.Unmarshal([]byte(out), &gs); err != nil {
		t.Fatalf("failed groups --json: %v\n%s", err, out)
	}
	byCause := map[string]jsonGroup{}
	for _, g := range gs {
		byCause[g.Consumer+" "+g.Class+" "+g.Cause] = g
	}
	return byCause
}

func failedGroups(t *testing.T, q *quarantineDB) {
	ctx := context.Background()
	url := testamqp.URL(t)
	exchange := testamqp.Name("idem_t_groups_")
	queue := exchange + ".stock"
	q.exec(t, `CREATE TABLE reservation (event_id VARCHAR(36) PRIMARY KEY)`)
	insert := "INSERT INTO reservation (event_id) VALUES (?)"
	if q.dialect == "postgres" {
		insert = "INSERT INTO reservation (event_id) VALUES ($1)"
	}
	var (
		mu      sync.Mutex
		applied []uuid.UUID
	)
	c, err := inbox.New[*sql.Tx](q.drv, inbox.Config{Name: "stock"})
	if err != nil {
		t.Fatal(err)
	}
	c.Handle(inbox.AnyEvent, func(ctx context.Context, tx *sql.Tx, ev idemmsg.Event) error {
		if _, err := tx.ExecContext(ctx, insert, ev.ID.String()); err != nil {
			return err
		}
		mu.Lock()
		applied = append(applied, ev.ID)
		mu.Unlock()
		return nil
	})
	sub, err := amqp.NewSubscriber(amqp.SubscriberConfig{
		ConnConfig: amqp.ConnConfig{URL: url}, Exchange: exchange, Queue: queue, Bindings: []string{"#"}, Workers: 1,
	}, c.DeliverBatch)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Stop(context.Background()) })

	store := c.Failures()
	park := func(consumer, aggregate string, errText func(uuid.UUID) string) idemmsg.FailedMessage {
		t.Helper()
		ev, err := idemmsg.NewEvent("order.order.placed.v1", "order", aggregate, map[string]string{"customer": aggregate})
		if err != nil {
			t.Fatal(err)
		}
		msg, err := idemmsg.NewMessage(ev)
		if err != nil {
			t.Fatal(err)
		}
		m := idemmsg.FailedMessage{Consumer: consumer, Source: queue, EventID: ev.ID, EventName: ev.Name, AggregateType: "order",
			AggregateID: aggregate, Key: msg.Key, Headers: msg.Headers, Body: msg.Body, Error: errText(ev.ID), Attempts: 1}
		if m.ID, err = store.Save(ctx, m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	qty := func(n int, permanent bool) func(uuid.UUID) string {
		return func(id uuid.UUID) string {
			p := ""
			if permanent {
				p = "permanent: "
			}
			return fmt.Sprintf(`idem: handling order.order.placed.v1 %s: %sfield "qty" is %d at 2026-12-0%dT08:00:00Z`, id, p, n, -n%9+1)
		}
	}
	product := func(id uuid.UUID) string {
		return fmt.Sprintf(`idem: handling order.order.placed.v1 %s: permanent: unknown product '%s'`, id, id.String()[:8])
	}
	var qtyGroup, productGroup []idemmsg.FailedMessage
	for i := range 3 {
		qtyGroup = append(qtyGroup, park("stock", fmt.Sprint("q", i), qty(-3-i*4, true)))
		productGroup = append(productGroup, park("stock", fmt.Sprint("p", i), product))
	}
	exhausted := park("stock", "e0", qty(-3, false))
	billing := park("billing", "b0", qty(-3, true))
	// A later event of q1's aggregate, parked behind it: in the held
	// group, and re-driven right after q1 when q1's group is.
	heldEvent, err := idemmsg.NewEvent("order.order.placed.v1", "order", "q1", map[string]string{"customer": "q1"})
	if err != nil {
		t.Fatal(err)
	}
	heldMsg, err := idemmsg.NewMessage(heldEvent)
	if err != nil {
		t.Fatal(err)
	}
	held := idemmsg.FailedMessage{Consumer: "stock", Source: queue, EventID: heldEvent.ID, EventName: heldEvent.Name, AggregateType: "order",
		AggregateID: "q1", HeldBy: qtyGroup[1].ID, Key: heldMsg.Key, Headers: heldMsg.Headers, Body: heldMsg.Body, Attempts: 1,
		Error: fmt.Sprintf("idem: held behind parked message %d of aggregate order q1, which is retried or removed first", qtyGroup[1].ID)}
	if held.ID, err = store.Save(ctx, held); err != nil {
		t.Fatal(err)
	}

	env := map[string]string{"IDEM_DB_URL": q.url, "IDEM_BROKER_URL": url}
	const qtyCause = `idem: handling order.order.placed.v1 <uuid>: permanent: field <q> is <n> at <time>`
	groups := groupsJSON(t, env)
	qg, pg := groups["stock permanent "+qtyCause], groups[`stock permanent idem: handling order.order.placed.v1 <uuid>: permanent: unknown product <q>`]
	eg, bg := groups[`stock exhausted idem: handling order.order.placed.v1 <uuid>: field <q> is <n> at <time>`], groups["billing permanent "+qtyCause]
	hg := groups["stock held idem: held behind parked message <n> of aggregate order <id>, which is retried or removed first"]
	if len(groups) != 5 || qg.Count != 3 || pg.Count != 3 || eg.Count != 1 || bg.Count != 1 || hg.Count != 1 {
		t.Fatalf("groups %+v; want the three qty failures in one group, the three product ones in another, the exhausted one, the held one and billing's apart", groups)
	}
	if qg.ID == bg.ID || len(qg.ID) != 12 || qg.Example != qtyGroup[2].Error || qg.LastFailed.Before(qg.FirstFailed) {
		t.Errorf("qty group %+v", qg)
	}
	if again := groupsJSON(t, env, "--consumer", "stock"); len(again) != 4 || again["stock permanent "+qtyCause].ID != qg.ID {
		t.Errorf("groups of stock %+v: want the same ids, billing's left out", again)
	}
	code, out, errOut := idem(t, env, "", "failed", "groups")
	if code != 0 || !strings.Contains(out, qg.ID+"  stock") || !strings.Contains(out, "field <q> is <n>") || !strings.Contains(out, "5 group(s), 9 message(s)") {
		t.Fatalf("failed groups = %d\n%s%s", code, out, errOut)
	}

	// retry --group asks first, then re-drives exactly the group's
	// messages, which the consumer applies.
	code, _, errOut = idem(t, env, "n\n", "failed", "retry", "--group", qg.ID)
	if code != 1 || !strings.Contains(errOut, "Retry the 3 failed message(s) of group "+qg.ID) || !strings.Contains(errOut, "not confirmed") {
		t.Fatalf("failed retry --group answered no = %d %q", code, errOut)
	}
	code, out, errOut = idem(t, env, "y\n", "failed", "retry", "--group", qg.ID)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("Retried 3 failed message(s) of group %s, and 1 held behind them.", qg.ID)) {
		t.Fatalf("failed retry --group = %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(errOut, `msg="failed retry done" messages=3 total=3 percent=100 `) || !strings.Contains(errOut, "held_behind_them=1 not_retried=0") {
		t.Errorf("failed retry --group logged no summary:\n%s", errOut)
	}
	for _, m := range qtyGroup {
		if !strings.Contains(out, fmt.Sprintf("Retried %d ", m.ID)) {
			t.Errorf("failed retry --group did not retry %d:\n%s", m.ID, out)
		}
	}
	// A message published after the retry, on the same queue with one
	// worker: once it is applied, everything the retry sent has been
	// handled.
	sentinel, err := idemmsg.NewEvent("order.order.placed.v1", "order", "sentinel", map[string]int{})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := idemmsg.NewMessage(sentinel)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := amqp.NewPublisher(amqp.PublisherConfig{ConnConfig: amqp.ConnConfig{URL: url}, Exchange: exchange})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Publish(ctx, []idemmsg.Message{msg}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the sentinel applied", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(applied, sentinel.ID)
	})
	mu.Lock()
	got := slices.Clone(applied)
	mu.Unlock()
	want := []uuid.UUID{qtyGroup[0].EventID, qtyGroup[1].EventID, heldEvent.ID, qtyGroup[2].EventID, sentinel.ID}
	if !slices.Equal(got, want) {
		t.Errorf("applied %v, want the qty group, oldest first, the held message right after the one it waited behind, then the sentinel: %v", got, want)
	}
	waitFor(t, "the applied messages gone from the store", func() bool { return remainingIDs(t, store) == 5 })
	after := groupsJSON(t, env)
	if _, ok := after["stock permanent "+qtyCause]; ok || len(after) != 3 || after["billing permanent "+qtyCause].Count != 1 {
		t.Errorf("groups after the retry: %+v", after)
	}

	// remove --group removes exactly the group's messages.
	code, out, errOut = idem(t, env, "", "failed", "remove", "--group", pg.ID, "--yes")
	if code != 0 || !strings.Contains(out, fmt.Sprintf("Removed 3 failed message(s) of group %s.", pg.ID)) {
		t.Fatalf("failed remove --group = %d\n%s%s", code, out, errOut)
	}
	for _, m := range productGroup {
		if _, err := store.Get(ctx, m.ID); err == nil {
			t.Errorf("message %d of the removed group is still stored", m.ID)
		}
	}
	for _, m := range []idemmsg.FailedMessage{exhausted, billing} {
		if _, err := store.Get(ctx, m.ID); err != nil {
			t.Errorf("message %d of another group: %v", m.ID, err)
		}
	}
	code, _, errOut = idem(t, env, "", "failed", "remove", "--group", pg.ID, "--yes")
	if code != 1 || !strings.Contains(errOut, "no failed message of group") {
		t.Errorf("failed remove --group of a gone group = %d %q", code, errOut)
	}

	failedRelayGroups(t, q)
}

// remainingIDs counts the stored messages.
func remainingIDs(t *testing.T, store *inbox.FailureStore) int {
	t.Helper()
	all, err := store.List(context.Background(), idemmsg.FailedFilter{})
	if err != nil {
		t.Fatal(err)
	}
	return len(all)
}

// failedRelayGroups quarantines outbox rows for two causes, then groups,
// requeues one group and removes the other with "idem failed ... --relay".
func failedRelayGroups(t *testing.T, q *quarantineDB) {
	ctx := context.Background()
	w := outbox.NewWriter(q.drv)
	for i := range 4 {
		ev, err := idemmsg.NewEvent("order.order.shipped.v1", "order", fmt.Sprint("r", i), map[string]int{"i": i})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.AddExec(ctx, q.drv.Pool(), ev); err != nil {
			t.Fatal(err)
		}
	}
	d, owner := q.drv.Dialect(), uuid.New()
	tx, err := q.drv.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := d.ClaimOutbox(ctx, q.drv.Tx(tx), driver.ClaimParams{Owner: owner, Lease: time.Minute, Limit: 10, MaxPerAggregate: 1})
	if err != nil || len(claimed) != 4 {
		t.Fatalf("claim: %d rows, %v", len(claimed), err)
	}
	if err := q.drv.Commit(ctx, tx); err != nil {
		t.Fatal(err)
	}
	var rows []driver.QuarantineRow
	for i, r := range claimed {
		e := fmt.Sprintf("refused by the broker on %d attempts; last: amqp: message %d returned: NO_ROUTE", 3+i, r.Seq)
		if i == 3 {
			e = fmt.Sprintf(`idem: outbox row seq %d cannot be published: headers are not a JSON object`, r.Seq)
		}
		rows = append(rows, driver.QuarantineRow{Seq: r.Seq, Error: e})
	}
	if _, err := d.QuarantineOutbox(ctx, q.drv.Pool(), owner, rows); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"IDEM_DB_URL": q.url}
	groups := groupsJSON(t, env, "--relay")
	refused := groups["relay refused refused by the broker on <n> attempts; last: amqp: message <n> returned: NO_ROUTE"]
	unreadable := groups["relay unreadable idem: outbox row seq <n> cannot be published: headers are not a JSON object"]
	if len(groups) != 2 || refused.Count != 3 || unreadable.Count != 1 {
		t.Fatalf("relay groups %+v", groups)
	}
	code, out, errOut := idem(t, env, "y\n", "failed", "retry", "--relay", "--group", refused.ID)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("Requeued 3 quarantined outbox row(s) of group %s", refused.ID)) {
		t.Fatalf("failed retry --relay --group = %d\n%s%s", code, out, errOut)
	}
	left, err := d.ListQuarantined(ctx, q.drv.Pool(), driver.QuarantineFilter{})
	if err != nil || len(left) != 1 || left[0].Seq != claimed[3].Seq {
		t.Fatalf("quarantined after the requeue: %v %v; want seq %d only", left, err, claimed[3].Seq)
	}
	code, _, errOut = idem(t, env, "n\n", "failed", "remove", "--relay", "--group", unreadable.ID)
	if code != 1 || !strings.Contains(errOut, "never be published") {
		t.Fatalf("failed remove --relay --group answered no = %d %q", code, errOut)
	}
	code, out, errOut = idem(t, env, "", "failed", "remove", "--relay", "--group", unreadable.ID, "--yes")
	if code != 0 || !strings.Contains(out, "Removed seq "+strconv.FormatInt(claimed[3].Seq, 10)) ||
		!strings.Contains(out, fmt.Sprintf("Removed 1 quarantined outbox row(s) of group %s", unreadable.ID)) {
		t.Fatalf("failed remove --relay --group = %d\n%s%s", code, out, errOut)
	}
	backlog, err := d.OutboxBacklog(ctx, q.drv.Pool())
	if err != nil || backlog.Rows != 3 || backlog.Quarantined != 0 {
		t.Fatalf("backlog %+v %v: want the three requeued rows, none quarantined", backlog, err)
	}
}

func TestFailedGroupsUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"failed", "groups", "x"}, "groups takes no arguments"},
		{[]string{"failed", "list", "--json"}, "--json goes with groups only"},
		{[]string{"failed", "show", "--group", "0123456789ab"}, "--group goes with retry, archive or remove"},
		{[]string{"failed", "retry", "--group", "0123456789ab", "--all"}, "one of them"},
		{[]string{"failed", "remove", "--group", "0123456789ab", "7"}, "one of them"},
		{[]string{"failed", "remove", "--group", "xyz"}, "want a group id of 12 hex digits"},
		{[]string{"failed", "retry", "--relay", "--group", "nothex"}, "want a group id"},
	} {
		code, _, errOut := idem(t, nil, "", tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v = %d %q, want usage error containing %q", tc.args, code, errOut, tc.want)
		}
	}
	code, out, _ := idem(t, nil, "", "help", "failed")
	for _, want := range []string{"idem failed groups", "--group GROUP", "normalized", "idem failed groups --relay"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("help failed lacks %q", want)
		}
	}
}
