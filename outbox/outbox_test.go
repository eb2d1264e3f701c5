package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/goleak"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/migrate"
	"github.com/idem-go/idem/outbox"
)

func TestMain(m *testing.M) {
	os.Exit(testdb.RunWithExampleDatabase(m,
		func() error { return goleak.Find(goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener")) },
		`CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL)`))
}

func TestRolledBackEventsDoNotExistCommittedOnesDo(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	pg.Exec(t, `CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL)`)
	ctx := context.Background()
	w := outbox.NewWriter(pg.Driver)

	// Rolled back: neither the order nor its event.
	tx, err := pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ('41', 'confirmed')`); err != nil {
		t.Fatal(err)
	}
	lost, _ := idem.NewEvent("order.order.placed.v1", "order", "41", map[string]string{"orderId": "41"})
	if err := w.Add(ctx, tx, lost); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := pg.Count(t, "outbox"); n != 0 {
		t.Fatalf("outbox rows after rollback = %d, want 0", n)
	}

	// Committed: both, with the exact columns.
	at := time.Date(2026, 12, 2, 8, 0, 0, 123456789, time.UTC)
	ev := idem.Event{
		ID: idem.NewEventID(), Name: "order.order.placed.v1", OccurredAt: at,
		AggregateType: "order", AggregateID: "42", AggregateVersion: 3,
		Payload: json.RawMessage(`{"orderId":"42","lines":[{"productId":"p-1","quantity":"2.000"}]}`),
		Headers: map[string]string{"traceparent": "00-abc-01"},
	}
	tx, err = pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ('42', 'confirmed')`); err != nil {
		t.Fatal(err)
	}
	if err := w.Add(ctx, tx, ev); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var (
		id                  uuid.UUID
		aggType, aggID, typ string
		payload, headers    []byte
		occurred            time.Time
		version             int64
		published           *time.Time
		attempts            int
		seq                 int64
	)
	err = pg.Pool.QueryRow(ctx, `SELECT id, aggregatetype, aggregateid, type, payload::text::bytea, occurred_at,
		aggregate_version, headers::text::bytea, published_at, attempts, seq FROM outbox`).
		Scan(&id, &aggType, &aggID, &typ, &payload, &occurred, &version, &headers, &published, &attempts, &seq)
	if err != nil {
		t.Fatal(err)
	}
	if id != ev.ID || aggType != "order" || aggID != "42" || typ != "order.order.placed.v1" || version != 3 ||
		!occurred.Equal(at.Truncate(time.Microsecond)) || published != nil || attempts != 0 || seq == 0 {
		t.Errorf("row = %v %q %q %q v%d at %v published %v attempts %d seq %d; want the event's values, unpublished",
			id, aggType, aggID, typ, version, occurred, published, attempts, seq)
	}
	var gotPayload, wantPayload any
	_ = json.Unmarshal(payload, &gotPayload)
	_ = json.Unmarshal(ev.Payload, &wantPayload)
	if b1, _ := json.Marshal(gotPayload); string(b1) != mustJSON(wantPayload) {
		t.Errorf("payload = %s, want %s", payload, ev.Payload)
	}
	if string(headers) != `{"traceparent": "00-abc-01"}` {
		t.Errorf("headers = %s", headers)
	}
}

func mustJSON(v any) string { b, _ := json.Marshal(v); return string(b) }

func TestAddWithDatabaseSQL(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	ctx := context.Background()
	w := outbox.NewWriter(postgres.NewSQL(pg.DB))
	tx, err := pg.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	evs := make([]idem.Event, 1500) // more than one multi-row insert
	for i := range evs {
		evs[i], _ = idem.NewEvent("order.order.placed.v1", "order", "42", map[string]int{"n": i})
	}
	if err := w.Add(ctx, tx, evs...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := pg.Count(t, "outbox"); n != len(evs) {
		t.Fatalf("rows = %d, want %d", n, len(evs))
	}
	// seq follows the order of the events within the transaction.
	var ordered bool
	if err := pg.Pool.QueryRow(ctx, `SELECT bool_and(ok) FROM (
		SELECT (payload->>'n')::int = row_number() OVER (ORDER BY seq) - 1 AS ok FROM outbox) s`).Scan(&ordered); err != nil || !ordered {
		t.Fatalf("seq order matches event order: %v, %v", ordered, err)
	}
}

func TestAddRejectsInvalidEvents(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	w := outbox.NewWriter(pg.Driver)
	ok, _ := idem.NewEvent("order.order.placed.v1", "order", "42", nil)
	for name, mutate := range map[string]func(*idem.Event){
		"event_id":     func(e *idem.Event) { e.ID = uuid.Nil },
		"event_name":   func(e *idem.Event) { e.Name = "" },
		"aggregate_id": func(e *idem.Event) { e.AggregateID = "" },
		"payload":      func(e *idem.Event) { e.Payload = json.RawMessage(`{"a":`) },
	} {
		ev := ok
		mutate(&ev)
		err := w.AddExec(context.Background(), pg.Driver.Pool(), ev)
		var fe *idem.FieldError
		if !errors.As(err, &fe) || fe.Field != name {
			t.Errorf("%s: err = %v, want a FieldError naming %s", name, err, name)
		}
	}
	if n := pg.Count(t, "outbox"); n != 0 {
		t.Errorf("rows = %d, want 0", n)
	}
}

// TestDebeziumColumnsOnly inserts a row the way another program (the PHP code
// of the second article) does: with the five Debezium columns only.
func TestDebeziumColumnsOnly(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	pg.Exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		VALUES ('0193a1b2-0000-7000-8000-000000000042', 'order', '42', 'OrderCreated', '{"orderId": 42, "schemaVersion": 1}')`)
	if n := pg.Count(t, "outbox WHERE published_at IS NULL AND attempts = 0 AND occurred_at IS NOT NULL AND headers = '{}'"); n != 1 {
		t.Fatalf("defaulted row not found")
	}
}

func TestSchemaQualifiedTables(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t, testdb.Options{NoMigrate: true})
	ctx := context.Background()
	schema := "Shop Events" // needs quoting
	_, err := postgres.NewPgxTables(pg.Pool, idem.Tables{Schema: schema, Outbox: "order_outbox"})
	if err == nil {
		t.Fatal("a schema name with a space must be refused, it is not a portable identifier")
	}
	drv, err := postgres.NewPgxTables(pg.Pool, idem.Tables{Schema: pg.Schema + "_x", Outbox: "order_outbox", ProcessedEvent: "stock_processed", IdempotentRequest: "order_keys"})
	if err != nil {
		t.Fatal(err)
	}
	pg.Exec(t, `CREATE SCHEMA `+postgres.QuoteIdent(pg.Schema+"_x"))
	t.Cleanup(func() { pg.Exec(t, `DROP SCHEMA `+postgres.QuoteIdent(pg.Schema+"_x")+` CASCADE`) })
	if _, err := migrate.New(drv).Up(ctx); err != nil {
		t.Fatal(err)
	}
	ev, _ := idem.NewEvent("order.order.placed.v1", "order", "42", nil)
	if err := outbox.NewWriter(drv).AddExec(ctx, drv.Pool(), ev); err != nil {
		t.Fatal(err)
	}
	if n := pg.Count(t, postgres.QuoteIdent(pg.Schema+"_x")+".order_outbox"); n != 1 {
		t.Fatalf("rows in the configured table = %d, want 1", n)
	}
	for _, name := range []string{"outbox", "processed_event", "idempotent_request"} {
		if n := pg.Count(t, "pg_tables WHERE schemaname = $1 AND tablename = $2", pg.Schema+"_x", name); n != 0 {
			t.Fatalf("the default table name %s was created too", name)
		}
	}
	if n := pg.Count(t, "pg_tables WHERE schemaname = $1 AND tablename = 'order_keys'", pg.Schema+"_x"); n != 1 {
		t.Fatal("the configured idempotency key table was not created")
	}
}

// A delayed event needs a row to wait in: the log writer refuses it.
func TestLogWriterRefusesDelayedEvents(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	w, err := outbox.NewLogWriter(pg.Driver, pg.Schema)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := idem.NewEvent("order.order.reminded.v1", "order", "1", map[string]int{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	ev.NotBefore = time.Now().Add(time.Hour)
	if err := w.AddExec(context.Background(), pg.Driver.Pool(), ev); !errors.Is(err, outbox.ErrNotSupported) {
		t.Fatalf("log writer with a delayed event: %v, want ErrNotSupported", err)
	}
	// A time already passed is no delay.
	ev.NotBefore = time.Now().Add(-time.Hour)
	if err := w.AddExec(context.Background(), pg.Driver.Pool(), ev); err != nil {
		t.Fatalf("log writer with NotBefore in the past: %v", err)
	}
}
