package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
)

// quarantineDB is a database for the --relay commands, with what the test
// needs to write rows as another program would.
type quarantineDB struct {
	dialect string
	url     string
	db      *sql.DB
	drv     driver.Driver[*sql.Tx]
}

// exec runs query (placeholders ?) on the database.
func (q *quarantineDB) exec(t *testing.T, query string, args ...any) {
	t.Helper()
	if q.dialect == "postgres" {
		for i := 1; strings.Contains(query, "?"); i++ {
			query = strings.Replace(query, "?", "$"+strconv.Itoa(i), 1)
		}
	}
	if _, err := q.db.ExecContext(context.Background(), query, args...); err != nil {
		t.Fatalf("exec %q: %v", query, err)
	}
}

func (q *quarantineDB) seq(t *testing.T, aggregate string) int64 {
	t.Helper()
	query := "SELECT MIN(seq) FROM outbox WHERE aggregateid = ? AND published_at IS NULL"
	if q.dialect == "postgres" {
		query = strings.Replace(query, "?", "$1", 1)
	}
	var seq int64
	if err := q.db.QueryRowContext(context.Background(), query, aggregate).Scan(&seq); err != nil {
		t.Fatal(err)
	}
	return seq
}

// foreignRow inserts a row another program wrote, which the relay cannot
// publish, in an aggregate whose id holds a control character; on SQLite
// its headers are bytes that are not even UTF-8.
func (q *quarantineDB) foreignRow(t *testing.T, aggregate string) int64 {
	t.Helper()
	switch q.dialect {
	case "postgres":
		q.exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, headers) VALUES (?, 'order', ?, 'OrderCreated', '{"orderId": 42}', '"not an object"')`,
			uuid.NewString(), aggregate)
	case "sqlite":
		q.exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, headers) VALUES (?, 'order', ?, 'OrderCreated', '{"orderId": 42}', X'FF00')`,
			"E42-"+aggregate, aggregate)
	default:
		q.exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (?, 'order', ?, 'OrderCreated', '{"orderId": 42}')`,
			"E42\x01-"+aggregate, aggregate)
	}
	return q.seq(t, aggregate)
}

// repair makes the row publishable, as an operator would, and returns its
// event id.
func (q *quarantineDB) repair(t *testing.T, seq int64) uuid.UUID {
	t.Helper()
	id := idemmsg.NewEventID()
	q.exec(t, `UPDATE outbox SET id = ?, headers = '{}' WHERE seq = ?`, id.String(), seq)
	return id
}

// TestFailedRelayCommands quarantines rows another program wrote, on every
// dialect, then lists, shows (byte for byte), re-drives and removes them
// with "idem failed --relay" while a relay runs: the rows behind them wait,
// then go, in order.
func TestFailedRelayCommands(t *testing.T) {
	t.Parallel()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		pg := testdb.NewPostgres(t)
		failedRelay(t, &quarantineDB{dialect: "postgres", url: pg.URL, db: pg.DB, drv: postgres.NewSQL(pg.DB)})
	})
	t.Run("mariadb", func(t *testing.T) {
		t.Parallel()
		m := testdb.NewMariaDB(t)
		failedRelay(t, &quarantineDB{dialect: "mysql", url: m.URL, db: m.DB, drv: m.Driver})
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		s := testdb.NewSQLite(t)
		failedRelay(t, &quarantineDB{dialect: "sqlite", url: "sqlite:" + s.URL, db: s.DB, drv: s.Driver})
	})
}

func failedRelay(t *testing.T, q *quarantineDB) {
	const held, dropped = "cust\x07omer", "other"
	w := outbox.NewWriter(q.drv)
	write := func(aggregate string, version int) idemmsg.Event {
		t.Helper()
		ev, err := idemmsg.NewEvent("order.order.changed.v1", "order", aggregate, map[string]int{"version": version})
		if err != nil {
			t.Fatal(err)
		}
		ev.AggregateVersion = int64(version)
		if err := w.AddExec(context.Background(), q.drv.Pool(), ev); err != nil {
			t.Fatal(err)
		}
		return ev
	}
	first := q.foreignRow(t, held)
	behind := write(held, 2)
	other := q.foreignRow(t, dropped)
	afterOther := write(dropped, 2)
	good := write("fine", 1)

	pub := memory.New()
	r, err := relay.New(q.drv, pub, relay.Config{
		Workers: 1, PollInterval: 20 * time.Millisecond, RetryBackoff: 10 * time.Millisecond,
		MaxRetryBackoff: 50 * time.Millisecond, StatsInterval: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	waitFor(t, "both foreign rows quarantined", func() bool { return r.Stats().Quarantined == 2 && pub.Len() == 1 })

	env := map[string]string{"IDEM_DB_URL": q.url}
	code, out, errOut := idem(t, env, "", "failed", "list", "--relay")
	if code != 0 || !slices.Equal(listedSeqs(out), []int64{first, other}) || !strings.Contains(out, "cannot be published") ||
		!strings.Contains(out, strconv.Quote(held)) {
		t.Fatalf("failed list --relay = %d\n%s%s", code, out, errOut)
	}
	code, out, _ = idem(t, env, "", "failed", "list", "--relay", "--limit", "1")
	if code != 0 || !slices.Equal(listedSeqs(out), []int64{first}) || !strings.Contains(out, fmt.Sprintf("--after-seq %d", first)) {
		t.Fatalf("failed list --relay --limit 1 = %d\n%s", code, out)
	}
	code, out, _ = idem(t, env, "", "failed", "list", "--relay", "--after-seq", strconv.FormatInt(first, 10))
	if code != 0 || !slices.Equal(listedSeqs(out), []int64{other}) || strings.Contains(out, "More rows") {
		t.Fatalf("failed list --relay --after-seq = %d\n%s", code, out)
	}
	code, out, _ = idem(t, env, "", "failed", "list", "--relay", "--aggregate-id", dropped, "--event", "OrderCreated", "--since", "1h")
	if code != 0 || !slices.Equal(listedSeqs(out), []int64{other}) {
		t.Fatalf("failed list --relay with filters = %d\n%s", code, out)
	}

	// show prints what is stored, quoting what is not printable.
	code, out, errOut = idem(t, env, "", "failed", "show", "--relay", strconv.FormatInt(first, 10))
	wantShown := []string{"Seq:             " + strconv.FormatInt(first, 10), strconv.Quote(held), "cannot be published", "Attempts:        1", `{"orderId": 42}`}
	switch q.dialect {
	case "postgres":
		wantShown = append(wantShown, `"not an object"`)
	case "sqlite":
		wantShown = append(wantShown, `"\xff\x00"`, "holds the control character 0x07")
	default:
		wantShown = append(wantShown, "ID:              "+strconv.Quote("E42\x01-"+held))
	}
	if q.dialect != "sqlite" {
		wantShown[4] = `"orderId"`
	}
	for _, want := range wantShown {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("failed show --relay lacks %q: %d\n%s%s", want, code, out, errOut)
		}
	}

	// Re-driven as it is, the row is quarantined again.
	code, out, errOut = idem(t, env, "", "failed", "retry", "--relay", strconv.FormatInt(first, 10))
	if code != 0 || !strings.Contains(out, "Requeued seq "+strconv.FormatInt(first, 10)) || !strings.Contains(errOut, "quarantined again") {
		t.Fatalf("failed retry --relay of an unreadable row = %d\n%s%s", code, out, errOut)
	}
	waitFor(t, "the row quarantined again", func() bool { return r.Stats().Quarantined == 3 })

	// Repaired, then re-driven with --all and a filter: it goes, then the row
	// behind it.
	id := q.repair(t, first)
	code, out, errOut = idem(t, env, "", "failed", "retry", "--relay", "--all", "--aggregate-id", held)
	if code != 0 || !strings.Contains(out, "Requeued seq "+strconv.FormatInt(first, 10)) || strings.Contains(out, "Requeued seq "+strconv.FormatInt(other, 10)) {
		t.Fatalf("failed retry --relay --all = %d\n%s%s", code, out, errOut)
	}
	waitFor(t, "the re-driven aggregate published", func() bool { return pub.Len() == 3 })
	if got := keyIDs(pub.Messages(), held); !slices.Equal(got, []uuid.UUID{id, behind.ID}) {
		t.Fatalf("aggregate published %v, want %v then %v", got, id, behind.ID)
	}

	// remove asks first.
	code, _, errOut = idem(t, env, "n\n", "failed", "remove", "--relay", strconv.FormatInt(other, 10))
	if code != 1 || !strings.Contains(errOut, "not confirmed") {
		t.Fatalf("failed remove --relay answered no = %d %s", code, errOut)
	}
	code, out, errOut = idem(t, env, "", "failed", "remove", "--relay", strconv.FormatInt(other, 10), "--yes")
	if code != 0 || !strings.Contains(out, "Removed seq "+strconv.FormatInt(other, 10)) {
		t.Fatalf("failed remove --relay --yes = %d\n%s%s", code, out, errOut)
	}
	waitFor(t, "the row behind the removed one published", func() bool { return pub.Len() == 4 })
	if got := keyIDs(pub.Messages(), dropped); !slices.Equal(got, []uuid.UUID{afterOther.ID}) {
		t.Fatalf("aggregate published %v, want %v", got, afterOther.ID)
	}
	if got := keyIDs(pub.Messages(), "fine"); !slices.Equal(got, []uuid.UUID{good.ID}) {
		t.Fatalf("the other aggregate published %v", got)
	}

	code, out, _ = idem(t, env, "", "failed", "list", "--relay")
	if code != 0 || !strings.Contains(out, "No quarantined outbox row") {
		t.Fatalf("failed list --relay at the end = %d\n%s", code, out)
	}
	code, _, errOut = idem(t, env, "", "failed", "show", "--relay", strconv.FormatInt(first, 10))
	if code != 1 || !strings.Contains(errOut, "no quarantined outbox row with seq") {
		t.Fatalf("failed show --relay of a published row = %d %s", code, errOut)
	}
	if q.dialect != "postgres" { // its outbox takes UUIDs only
		legacyQuarantined(t, q, r, pub)
	}
}

// legacyQuarantined: a row whose id is not a UUID, quarantined for it by an
// idem before idem.EventID's rule, is published under the derived id, with
// the id in the header idem-original-id, once "idem failed retry --relay"
// re-drives it.
func legacyQuarantined(t *testing.T, q *quarantineDB, r *relay.Relay[*sql.Tx], pub *memory.Publisher) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.Stop(ctx); err != nil { // so that it does not publish the row before it is quarantined
		t.Fatal(err)
	}
	q.exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('E42', 'order', 'legacy', 'OrderCreated', '{"orderId": 42}')`)
	seq := q.seq(t, "legacy")
	d, owner := q.drv.Dialect(), uuid.New()
	tx, err := q.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := d.ClaimOutbox(ctx, q.drv.Tx(tx), driver.ClaimParams{Owner: owner, Lease: time.Minute, Limit: 10, MaxPerAggregate: 1})
	if err != nil || len(claimed) != 1 || claimed[0].Seq != seq {
		t.Fatalf("claim the legacy row: %v, %v", claimed, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.QuarantineOutbox(ctx, q.drv.Pool(), owner, []driver.QuarantineRow{{Seq: seq,
		Error: fmt.Sprintf(`idem: outbox row seq %d cannot be published: id "E42" is not a UUID`, seq)}}); err != nil {
		t.Fatal(err)
	}
	r2, err := relay.New(q.drv, pub, relay.Config{
		Workers: 1, PollInterval: 20 * time.Millisecond, StatsInterval: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r2.Stop(context.Background()) })
	env := map[string]string{"IDEM_DB_URL": q.url}
	want, err := idemmsg.EventID("E42")
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut := idem(t, env, "", "failed", "show", "--relay", strconv.FormatInt(seq, 10))
	if code != 0 || !strings.Contains(out, "Event ID:        "+want.String()) {
		t.Fatalf("failed show --relay of the legacy row = %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = idem(t, env, "", "failed", "retry", "--relay", strconv.FormatInt(seq, 10))
	if code != 0 || !strings.Contains(out, "Requeued seq "+strconv.FormatInt(seq, 10)) {
		t.Fatalf("failed retry --relay of the legacy row = %d\n%s%s", code, out, errOut)
	}
	if err := pub.Wait(ctx, func(msgs []idemmsg.Message, _ int) bool {
		return slices.ContainsFunc(msgs, func(m idemmsg.Message) bool { return m.EventID == want })
	}); err != nil {
		t.Fatalf("waiting for the re-driven legacy row: %v", err)
	}
	for _, m := range pub.Messages() {
		if m.EventID == want && m.Headers[idemmsg.HeaderOriginalID] != "E42" {
			t.Fatalf("legacy row published with headers %v, want %s: E42", m.Headers, idemmsg.HeaderOriginalID)
		}
	}
}

// listedSeqs returns the seqs in the output of "idem failed list --relay".
func listedSeqs(out string) []int64 {
	var seqs []int64
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if seq, err := strconv.ParseInt(f[0], 10, 64); err == nil {
			seqs = append(seqs, seq)
		}
	}
	return seqs
}

// keyIDs returns the event ids published with key, in order of first
// publication.
func keyIDs(msgs []idemmsg.Message, key string) []uuid.UUID {
	var out []uuid.UUID
	seen := map[uuid.UUID]bool{}
	for _, m := range msgs {
		if string(m.Key) == key && !seen[m.EventID] {
			seen[m.EventID] = true
			out = append(out, m.EventID)
		}
	}
	return out
}

func TestFailedRelayUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"failed", "--relay"}, "want one of list, groups, show, retry, remove"},
		{[]string{"failed", "show", "--relay"}, "show --relay takes one row seq"},
		{[]string{"failed", "retry", "--relay"}, "needs row seqs"},
		{[]string{"failed", "remove", "--relay", "1", "--all"}, "not both"},
		{[]string{"failed", "show", "--relay", "x"}, `row seq "x"`},
		{[]string{"failed", "list", "--relay", "--consumer", "stock"}, "--consumer does not apply with --relay"},
		{[]string{"failed", "list", "--relay", "--after-seq", "-1"}, "--after-seq"},
	} {
		code, _, errOut := idem(t, nil, "", tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v = %d %q, want usage error containing %q", tc.args, code, errOut, tc.want)
		}
	}
	code, out, _ := idem(t, nil, "", "help", "failed")
	if code != 0 || !strings.Contains(out, "idem failed retry  --relay") || !strings.Contains(out, "later rows of its aggregate wait") {
		t.Errorf("help failed does not teach --relay:\n%s", out)
	}
	code, out, _ = idem(t, nil, "", "help", "relay")
	if code != 0 || !strings.Contains(out, "-quarantine-after") || !strings.Contains(out, "idem failed ... --relay") {
		t.Errorf("help relay does not teach the quarantine:\n%s", out)
	}
}
