package main

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
)

// statusFixture fills a database with what idem status reports: an outbox
// with three rows waiting (the oldest for five minutes), one published 30
// seconds ago, one quarantined and two delayed (the first due in two
// hours); stock with four events processed in the
// last minute and one two hours ago; shipping with one event ten minutes
// ago and one waiting for a retry; billing with a message parked an hour
// ago.
func statusFixture(t *testing.T, pg *testdb.PG) {
	t.Helper()
	pg.Exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at, published_at, quarantined_at)
VALUES (gen_random_uuid(), 'order', '1', 'order.order.placed.v1', '{}', now() - interval '5 minutes', NULL, NULL),
       (gen_random_uuid(), 'order', '2', 'order.order.placed.v1', '{}', now() - interval '1 minute', NULL, NULL),
       (gen_random_uuid(), 'order', '3', 'order.order.placed.v1', '{}', now(), NULL, NULL),
       (gen_random_uuid(), 'order', '4', 'order.order.placed.v1', '{}', now() - interval '1 hour', now() - interval '30 seconds', NULL),
       (gen_random_uuid(), 'order', '5', 'order.order.placed.v1', '{}', now() - interval '1 hour', NULL, now() - interval '20 minutes')`)
	pg.Exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, not_before)
VALUES (gen_random_uuid(), 'order', '6', 'order.order.reminded.v1', '{}', now() + interval '2 hours'),
       (gen_random_uuid(), 'order', '7', 'order.order.reminded.v1', '{}', now() + interval '3 hours')`)
	pg.Exec(t, `INSERT INTO processed_event (consumer_name, event_id, processed_at)
SELECT 'stock', gen_random_uuid(), now() - s * interval '5 seconds' FROM generate_series(1, 4) AS s`)
	pg.Exec(t, `INSERT INTO processed_event (consumer_name, event_id, processed_at)
VALUES ('stock', gen_random_uuid(), now() - interval '2 hours'), ('shipping', gen_random_uuid(), now() - interval '10 minutes')`)
	pg.Exec(t, `INSERT INTO delivery_attempt (consumer_name, event_id, attempts, last_error) VALUES ('shipping', gen_random_uuid(), 2, 'carrier down')`)
	pg.Exec(t, `INSERT INTO failed_message (consumer_name, source, body, error, attempts, first_failed_at, failed_at)
VALUES ('billing', 'billing.events', 'not json', 'undecodable', 1, now() - interval '1 hour', now() - interval '1 hour')`)
}

func TestStatusCommand(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	statusFixture(t, pg)
	amqpURL := testamqp.URL(t)
	prefix := testamqp.Name("idem_t_")
	queue := prefix + ".stock.events"
	withAMQPChannel(t, amqpURL, func(ch *amqp091.Channel) {
		if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			withAMQPChannel(t, amqpURL, func(ch *amqp091.Channel) { _, _ = ch.QueueDelete(queue, false, false, false) })
		})
		for range 3 {
			if err := ch.PublishWithContext(context.Background(), "", queue, false, false, amqp091.Publishing{Body: []byte("{}")}); err != nil {
				t.Fatal(err)
			}
		}
	})
	args := []string{"status", "--db", pg.URL, "--broker", amqpURL, "--prefix", prefix}

	// The screen.
	code, out, errOut := idem(t, nil, "", args...)
	if code != 0 {
		t.Fatalf("idem status = %d\n%s%s", code, out, errOut)
	}
	for _, re := range []string{
		`outbox: backlog 3, the oldest waiting for 5m0\ds; last publish 3\ds ago; quarantined 1\n`,
		`\n  scheduled: 2 delayed, the next due in (1h59m|2h00m) \(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)\n`,
		`CONSUMER +LAST PROCESSED +PER MIN +PARKED +OLDEST PARKED +RETRYING +QUEUE +READY +UNACKED +LAG +CONSUMERS\n`,
		`\n  billing +never +0 +1 +1h00m ago +0 +\(unknown to the broker\)\n`,
		`\n  shipping +10m0\ds ago +0 +0 +- +1 +\(unknown to the broker\)\n`,
		`\n  stock +[5-9]s ago +4 +0 +- +0 +` + regexp.QuoteMeta(queue) + ` +3 +- +- +0\n`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("idem status printed\n%s\nwant a match of %q", out, re)
		}
	}

	// The same figures for scripts.
	code, out, errOut = idem(t, nil, "", append(args, "--json", "--consumer", "audit")...)
	if code != 0 {
		t.Fatalf("idem status --json = %d\n%s%s", code, out, errOut)
	}
	var doc struct {
		Database string    `json:"database"`
		TakenAt  time.Time `json:"taken_at"`
		Outbox   struct {
			Table               string     `json:"table"`
			Present             bool       `json:"present"`
			Backlog             int64      `json:"backlog"`
			Quarantined         int64      `json:"quarantined"`
			Scheduled           int64      `json:"scheduled"`
			NextDueAt           *time.Time `json:"next_due_at"`
			NextDueInS          *float64   `json:"next_due_in_seconds"`
			OldestUnpublishedAt *time.Time `json:"oldest_unpublished_at"`
			OldestUnpublishedS  *float64   `json:"oldest_unpublished_age_seconds"`
			LastPublishedAt     *time.Time `json:"last_published_at"`
			LastPublishedS      *float64   `json:"last_published_age_seconds"`
		} `json:"outbox"`
		Consumers []struct {
			Name                string     `json:"name"`
			LastProcessedAt     *time.Time `json:"last_processed_at"`
			LastProcessedS      *float64   `json:"last_processed_age_seconds"`
			ProcessedLastMinute int64      `json:"processed_last_minute"`
			Parked              int64      `json:"parked"`
			OldestParkedAt      *time.Time `json:"oldest_parked_at"`
			OldestParkedS       *float64   `json:"oldest_parked_age_seconds"`
			Retrying            int64      `json:"retrying"`
			Broker              *struct {
				Queue     string `json:"queue"`
				Ready     *int64 `json:"ready"`
				Unacked   *int64 `json:"unacked"`
				Lag       *int64 `json:"lag"`
				Consumers *int64 `json:"consumers"`
			} `json:"broker"`
		} `json:"consumers"`
		BrokerError string `json:"broker_error"`
	}
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("decode %s: %v", out, err)
	}
	if dec.More() {
		t.Errorf("more than one document for one database: %s", out)
	}
	between := func(what string, v *float64, lo, hi float64) {
		t.Helper()
		if v == nil || *v < lo || *v > hi {
			t.Errorf("%s: %v, want between %v and %v", what, v, lo, hi)
		}
	}
	o := doc.Outbox
	if !o.Present || o.Table != "outbox" || o.Backlog != 3 || o.Quarantined != 1 || o.OldestUnpublishedAt == nil || o.LastPublishedAt == nil {
		t.Errorf("outbox: %+v", o)
	}
	between("oldest unpublished age", o.OldestUnpublishedS, 300, 360)
	if o.Scheduled != 2 || o.NextDueAt == nil {
		t.Errorf("outbox scheduled %d, next due at %v; want 2, in two hours", o.Scheduled, o.NextDueAt)
	}
	between("next due in", o.NextDueInS, 7200-60, 7200)
	between("last published age", o.LastPublishedS, 30, 90)
	if time.Since(doc.TakenAt).Abs() > time.Minute || !strings.HasPrefix(doc.Database, "postgres://") || doc.BrokerError != "" {
		t.Errorf("document: database %q, taken at %v, broker error %q", doc.Database, doc.TakenAt, doc.BrokerError)
	}
	if len(doc.Consumers) != 4 {
		t.Fatalf("consumers: %+v, want audit, billing, shipping, stock", doc.Consumers)
	}
	audit, billing, shipping, stock := doc.Consumers[0], doc.Consumers[1], doc.Consumers[2], doc.Consumers[3]
	if audit.Name != "audit" || audit.LastProcessedAt != nil || audit.LastProcessedS != nil || audit.Parked != 0 || audit.Broker != nil {
		t.Errorf("audit, named with --consumer only: %+v", audit)
	}
	if billing.Name != "billing" || billing.Parked != 1 || billing.OldestParkedAt == nil || billing.LastProcessedAt != nil || billing.Broker != nil {
		t.Errorf("billing: %+v", billing)
	}
	between("billing oldest parked age", billing.OldestParkedS, 3600, 3660)
	if shipping.Name != "shipping" || shipping.Retrying != 1 || shipping.ProcessedLastMinute != 0 || shipping.OldestParkedS != nil {
		t.Errorf("shipping: %+v", shipping)
	}
	between("shipping last processed age", shipping.LastProcessedS, 600, 660)
	if stock.Name != "stock" || stock.ProcessedLastMinute != 4 || stock.Parked != 0 || stock.Retrying != 0 {
		t.Errorf("stock: %+v", stock)
	}
	between("stock last processed age", stock.LastProcessedS, 5, 65)
	if b := stock.Broker; b == nil || b.Queue != queue || b.Ready == nil || *b.Ready != 3 || b.Unacked != nil || b.Lag != nil || b.Consumers == nil || *b.Consumers != 0 {
		t.Errorf("stock's queue: %+v, want %s with 3 ready, 0 consumers, unacked and lag unknown", stock.Broker, queue)
	}
}

func TestStatusCommandErrors(t *testing.T) {
	t.Parallel()
	empty := testdb.NewPostgres(t, testdb.Options{NoMigrate: true})
	for _, tc := range []struct {
		args []string
		want string
		code int
	}{
		{[]string{"status"}, "pass --db, --db-file FILE or set IDEM_DB_URL", 1},
		{[]string{"status", "--db", "mongodb://x"}, `scheme "mongodb" is not supported`, 1},
		{[]string{"status", "--db", "sqlite:" + t.TempDir() + "/none.db"}, "no such file or directory (give the file of a database idem migrated)", 1},
		{[]string{"status", "--db", empty.URL}, `run "idem migrate up"`, 1},
		{[]string{"status", "--db", empty.URL, "--broker", "https://example.com/hook"}, "cannot tell what waits for a consumer", 1},
		{[]string{"status", "--db", empty.URL, "--broker", "embedded?dir=" + t.TempDir()}, "only reachable from its own process", 1},
		{[]string{"status", "--db", empty.URL, "--watch", "soon"}, `unexpected argument "soon"`, 2},
		{[]string{"status", "--db", empty.URL, "--watch=1ms"}, "at least 100ms", 2},
	} {
		code, _, errOut := idem(t, nil, "", tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("idem %v = %d %q; want %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
}

// TestStatusConsumerOnly: a database whose outbox table is gone (or never
// was) still shows its consumers.
func TestStatusConsumerOnly(t *testing.T) {
	t.Parallel()
	db := testdb.NewSQLite(t)
	db.Exec(t, `INSERT INTO processed_event (consumer_name, event_id) VALUES ('stock', 'a'), ('stock', 'b')`)
	db.Exec(t, `DROP TABLE outbox`)
	code, out, errOut := idem(t, nil, "", "status", "--db", "sqlite:"+db.URL)
	if code != 0 || !strings.Contains(out, "outbox: no outbox table (a consumer-only database)") ||
		!regexp.MustCompile(`\n  stock +(\d+ms|\d+s) ago +2 +0 +- +0\n`).MatchString(out) {
		t.Fatalf("idem status = %d\n%s%s", code, out, errOut)
	}
}

// TestStatusBinlogPosition: on MariaDB, the position the binlog relay
// stored is shown under the outbox, in text and in JSON; without one,
// nothing is.
func TestStatusBinlogPosition(t *testing.T) {
	t.Parallel()
	db := testdb.NewMariaDB(t)
	code, out, errOut := idem(t, nil, "", "status", "--db", db.URL)
	if code != 0 || strings.Contains(out, "binlog relay") {
		t.Fatalf("idem status without a position = %d\n%s%s", code, out, errOut)
	}
	db.Exec(t, `INSERT INTO binlog_position (outbox_table, gtid_pos) VALUES ('outbox', '0-1-42')`)
	code, out, errOut = idem(t, nil, "", "status", "--db", db.URL)
	if code != 0 || !regexp.MustCompile(`\n  binlog relay: position 0-1-42, stored (\d+ms|\d+s) ago\n`).MatchString(out) {
		t.Fatalf("idem status = %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = idem(t, nil, "", "status", "--db", db.URL, "--json")
	if code != 0 || !strings.Contains(out, `"log_position":"0-1-42"`) {
		t.Fatalf("idem status --json = %d\n%s%s", code, out, errOut)
	}
}

// TestStatusWatch: --watch refreshes until its context ends, then exits 0.
func TestStatusWatch(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	statusFixture(t, pg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out lockedBuffer
	var errOut bytes.Buffer
	done := make(chan int, 1)
	go func() {
		e := &env{stdout: &out, stderr: &errOut, stdin: strings.NewReader(""), getenv: func(string) string { return "" }}
		done <- run(ctx, e, []string{"status", "--db", pg.URL, "--watch", "100ms"})
	}()
	deadline := time.Now().Add(30 * time.Second)
	for strings.Count(out.String(), "Every 100ms, until interrupted.") < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("three refreshes not printed in 30s:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A marker processed now shows at the next refresh.
	pg.Exec(t, `INSERT INTO processed_event (consumer_name, event_id) VALUES ('stock', gen_random_uuid())`)
	for !regexp.MustCompile(`\n  stock +(\d+ms|\d+s) ago +5 `).MatchString(out.String()) {
		if time.Now().After(deadline) {
			t.Fatalf("the new marker not shown in 30s:\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("idem status --watch interrupted = %d, want 0\n%s", code, errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("idem status --watch did not return after its context ended")
	}
}

// lockedBuffer is a bytes.Buffer safe for one writer and one reader.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// withAMQPChannel runs f on a channel of a fresh connection to url.
func withAMQPChannel(t *testing.T, url string, f func(ch *amqp091.Channel)) {
	t.Helper()
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Fatalf("connect to RabbitMQ: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	f(ch)
}
