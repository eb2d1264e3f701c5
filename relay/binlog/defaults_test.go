package binlog_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testlog"
	"github.com/idem-go/idem/relay/binlog"
	"github.com/idem-go/idem/relay/internal/logengine/logenginetest"
)

// logRecorder keeps the levels and messages of the records it passes on
// to the test's log ("WARN the outbox's columns changed...").
type logRecorder struct {
	next slog.Handler
	mu   *sync.Mutex
	msgs *[]string
}

// recordingConfig returns fastConfig with a logger that records, and a
// function that counts the records whose level and message hold substr.
func recordingConfig(t *testing.T) (binlog.Config, func(substr string) int) {
	rec := logRecorder{next: testlog.New(t).Handler(), mu: &sync.Mutex{}, msgs: new([]string)}
	cfg := fastConfig(t)
	cfg.Logger = slog.New(rec)
	count := func(substr string) int {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		n := 0
		for _, m := range *rec.msgs {
			if strings.Contains(m, substr) {
				n++
			}
		}
		return n
	}
	return cfg, count
}

func (r logRecorder) Enabled(ctx context.Context, l slog.Level) bool { return r.next.Enabled(ctx, l) }
func (r logRecorder) Handle(ctx context.Context, rec slog.Record) error {
	r.mu.Lock()
	*r.msgs = append(*r.msgs, rec.Level.String()+" "+rec.Message)
	r.mu.Unlock()
	return r.next.Handle(ctx, rec)
}
func (r logRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	r.next = r.next.WithAttrs(as)
	return r
}
func (r logRecorder) WithGroup(name string) slog.Handler {
	r.next = r.next.WithGroup(name)
	return r
}

// fromSchema is the start-up line of a relay that reads the column names
// from information_schema.
const fromSchema = "reading the outbox's column names from information_schema"

// TestServerDefaults runs the relay on a MariaDB server of its own with
// MariaDB's defaults, but for the two settings the relay needs changed
// (log_bin, binlog_format = ROW): binlog_row_metadata is NO_LOG, so the
// binlog holds no column names and the relay reads them from
// information_schema, across ALTER TABLEs of the outbox, live and while
// stopped.
func TestServerDefaults(t *testing.T) {
	srv := testdb.StartMariaDB(t, "log_bin = mariadb-bin", "binlog_format = ROW")
	check := srv.NewDB(t, testdb.Options{NoMigrate: true})
	var metadata, image string
	var compress bool
	var serverID int
	if err := check.DB.QueryRow(`SELECT @@binlog_row_metadata, @@binlog_row_image, @@log_bin_compress, @@server_id`).Scan(&metadata, &image, &compress, &serverID); err != nil {
		t.Fatal(err)
	}
	if metadata != "NO_LOG" || image != "FULL" || compress || serverID != 1 {
		t.Fatalf("MariaDB's defaults: binlog_row_metadata %s, binlog_row_image %s, log_bin_compress %v, server_id %d; want NO_LOG, FULL, false, 1 (update the docs of relay/binlog if they changed)",
			metadata, image, compress, serverID)
	}

	// An ALTER TABLE while the relay runs: the rows after it are read
	// with the new columns, a column added first moving every other one.
	t.Run("idem table, altered while read", func(t *testing.T) {
		db := srv.NewDB(t)
		pub := memory.New()
		cfg, logs := recordingConfig(t)
		r := start(t, db, pub, cfg)
		before := add(t, db, "a", 1, 3)
		waitLen(t, pub, 3)
		db.Exec(t, "ALTER TABLE outbox ADD COLUMN tenant VARCHAR(36) NULL FIRST")
		after := add(t, db, "a", 4, 6)
		msgs := waitLen(t, pub, 6)
		logenginetest.CheckFirstOrder(t, msgs, append(before, after...))
		checkEvents(t, msgs, "a")
		if n := logs("INFO " + fromSchema); n != 1 {
			t.Errorf("%d start-up lines %q, want 1", n, fromSchema)
		}
		if n := logs("WARN") + logs("ERROR"); n != 0 {
			t.Errorf("%d warnings and errors logged", n)
		}
		// The broker holds a message before the relay counts it.
		eventually(t, "6 messages counted published", func() bool { return r.Stats().Published == 6 })
		if s := r.Stats(); s.Unreadable != 0 || s.Published != 6 {
			t.Errorf("stats: %+v", s)
		}
	})

	// Rows logged before an ALTER TABLE and read after it (the relay was
	// stopped): they cannot be named from the binlog, and are published
	// from the table instead.
	t.Run("idem table, altered while stopped", func(t *testing.T) {
		db := srv.NewDB(t)
		pub := memory.New()
		cfg, logs := recordingConfig(t)
		r := start(t, db, pub, cfg)
		first := add(t, db, "a", 1, 2)
		waitLen(t, pub, 2)
		stop(t, r)
		old := add(t, db, "a", 3, 4)
		db.Exec(t, "ALTER TABLE outbox ADD COLUMN tenant VARCHAR(36) NULL FIRST")
		altered := add(t, db, "a", 5, 6)
		r = start(t, db, pub, cfg)
		sentinel := add(t, db, "a", 7, 7)
		eventually(t, "the sentinel published", func() bool { return wasPublished(pub.Messages(), sentinel[0]) })
		msgs := pub.Messages()
		if len(msgs) != 7 {
			t.Errorf("%d messages, want 7", len(msgs))
		}
		logenginetest.CheckFirstOrder(t, msgs, append(append(append(first, old...), altered...), sentinel...))
		checkEvents(t, msgs, "a")
		if n := logs("WARN the outbox's columns changed after rows the relay had not read yet"); n != 1 {
			t.Errorf("%d warnings of the changed columns, want 1", n)
		}
		if s := r.Stats(); s.Unreadable != 0 {
			t.Errorf("stats: %+v", s)
		}
		eventually(t, "published rows deleted", func() bool { return db.Count(t, "outbox") == 0 })
	})

	// A table with Debezium's columns, aggregateid an INT UNSIGNED: the
	// table map holds no signedness either, information_schema gives it.
	// Columns are added, two columns of one type swap names (the table
	// maps stay the same: the DDL in the binlog says to read the names
	// again), and a column is added out of the binlog (sql_log_bin = 0:
	// the table maps differ from the names read).
	t.Run("Debezium table, altered while read", func(t *testing.T) {
		db := srv.NewDB(t)
		db.Exec(t, `CREATE TABLE ext_outbox (id VARCHAR(64) NOT NULL PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL,
    aggregateid INT UNSIGNED NOT NULL, type VARCHAR(255) NOT NULL, payload JSON NULL)`)
		pub := memory.New()
		cfg, logs := recordingConfig(t)
		cfg.Tables.Outbox = "ext_outbox"
		start(t, db, pub, cfg)
		var ids []string
		insert := func() {
			ids = append(ids, uuid.NewString())
			db.Exec(t, `INSERT INTO ext_outbox (id, aggregatetype, aggregateid, type, payload)
VALUES (?, 'customer', 4000000000, 'customer.created.v1', JSON_OBJECT('n', ?))`, ids[len(ids)-1], len(ids))
		}
		insert()
		waitLen(t, pub, 1)
		db.Exec(t, "ALTER TABLE ext_outbox ADD COLUMN source VARCHAR(20) NULL AFTER id")
		insert()
		insert()
		waitLen(t, pub, 3)
		db.Exec(t, "ALTER TABLE ext_outbox RENAME COLUMN aggregatetype TO swapped")
		db.Exec(t, "ALTER TABLE ext_outbox RENAME COLUMN type TO aggregatetype")
		db.Exec(t, "ALTER TABLE ext_outbox RENAME COLUMN swapped TO type")
		insert()
		waitLen(t, pub, 4)
		ctx := context.Background()
		conn, err := db.DB.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{"SET SESSION sql_log_bin = 0", "ALTER TABLE ext_outbox ADD COLUMN region VARCHAR(10) NULL AFTER id", "SET SESSION sql_log_bin = 1"} {
			if _, err := conn.ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		_ = conn.Close()
		insert()
		msgs := waitLen(t, pub, 5)
		for i, m := range msgs {
			ev, err := idem.Decode(m)
			if err != nil {
				t.Fatal(err)
			}
			var p struct{ N int }
			if err := json.Unmarshal(ev.Payload, &p); err != nil || ev.ID.String() != ids[i] || ev.AggregateType != "customer" ||
				ev.AggregateID != "4000000000" || ev.Name != "customer.created.v1" || p.N != i+1 {
				t.Errorf("message %d: %+v (payload %s)", i, ev, ev.Payload)
			}
		}
		if n := logs("WARN") + logs("ERROR"); n != 0 {
			t.Errorf("%d warnings and errors logged", n)
		}
	})

	// Rows logged before an ALTER TABLE that keeps the number of columns
	// (aggregateid moved to the end) and read after it, in a table whose
	// waiting rows the relay cannot tell: it stops before them, says why
	// and what to do, and publishes nothing under a wrong name.
	t.Run("Debezium table, altered while stopped", func(t *testing.T) {
		db := srv.NewDB(t)
		db.Exec(t, `CREATE TABLE ext_outbox (id VARCHAR(64) NOT NULL PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL,
    aggregateid VARCHAR(255) NOT NULL, type VARCHAR(255) NOT NULL, payload JSON NULL)`)
		insert := func(aggregateID string) {
			db.Exec(t, `INSERT INTO ext_outbox (id, aggregatetype, aggregateid, type, payload) VALUES (?, 'customer', ?, 'customer.created.v1', '{}')`,
				uuid.NewString(), aggregateID)
		}
		pub := memory.New()
		cfg := fastConfig(t)
		cfg.Tables.Outbox = "ext_outbox"
		r := start(t, db, pub, cfg)
		insert("c-1")
		waitLen(t, pub, 1)
		stop(t, r)
		insert("c-2")
		db.Exec(t, "ALTER TABLE ext_outbox DROP COLUMN aggregateid, ADD COLUMN aggregateid VARCHAR(255) NOT NULL DEFAULT ''")
		insert("c-3")
		r = start(t, db, pub, cfg)
		eventually(t, "the relay stopped at the rows it cannot name", func() bool { return errors.Is(r.Healthy(), binlog.ErrColumnsChanged) })
		var e string
		eventually(t, "the error in the stats", func() bool {
			e = r.Stats().LastError
			return strings.Contains(e, binlog.ErrColumnsChanged.Error())
		})
		if !strings.Contains(e, "the binlog's column 4 is not the table's payload") || !strings.Contains(e, "idem cdc reset-position") ||
			!strings.Contains(e, "binlog_row_metadata = FULL") {
			t.Errorf("error: %s", e)
		}
		// It stopped before the first row logged under the old columns,
		// which comes before every later one.
		if n := pub.Len(); n != 1 {
			t.Errorf("%d messages, want 1", n)
		}
		// The way out the error gives: the waiting rows published
		// another way, the position forgotten.
		stop(t, r)
		if err := binlog.ResetPosition(context.Background(), db.URL, cfg.Tables); err != nil {
			t.Fatal(err)
		}
		r = start(t, db, pub, cfg)
		insert("c-4")
		msgs := waitLen(t, pub, 2)
		if ev, err := idem.Decode(msgs[1]); err != nil || ev.AggregateID != "c-4" || ev.Name != "customer.created.v1" {
			t.Errorf("after the reset: %+v, %v", ev, err)
		}
		if r.Healthy() != nil {
			t.Errorf("Healthy: %v", r.Healthy())
		}
	})
}

// checkEvents checks the fields the writer of add gave each message.
func checkEvents(t *testing.T, msgs []idem.Message, aggregateID string) {
	t.Helper()
	for _, m := range msgs {
		ev, err := idem.Decode(m)
		if err != nil {
			t.Fatal(err)
		}
		var p struct{ Version int64 }
		if err := json.Unmarshal(ev.Payload, &p); err != nil || ev.AggregateType != "order" || ev.AggregateID != aggregateID ||
			ev.Name != "order.changed.v1" || p.Version != ev.AggregateVersion {
			t.Errorf("message %s: %+v, %v", m.EventID, ev, err)
		}
	}
}

// TestMariaDBDefaultsRefused: on a server with MariaDB's defaults, the
// relay names the two settings to change, and only those.
func TestMariaDBDefaultsRefused(t *testing.T) {
	srv := testdb.StartMariaDB(t)
	db := srv.NewDB(t)
	r, err := binlog.New(db.URL, memory.New(), fastConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	err = r.Start(context.Background())
	if !errors.Is(err, binlog.ErrServerSettings) {
		t.Fatalf("Start: %v", err)
	}
	problems := strings.Split(strings.TrimPrefix(err.Error(), binlog.ErrServerSettings.Error()+": "), "; ")
	if len(problems) != 2 || !strings.HasPrefix(problems[0], "the binary log is off (log_bin)") ||
		!strings.HasPrefix(problems[1], "binlog_format is MIXED: ") {
		t.Errorf("Start: %v", err)
	}
}
