package binlog_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testlog"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay/binlog"
	"github.com/idem-go/idem/relay/internal/logengine/logenginetest"
	"github.com/idem-go/idem/relay/logrelay"
)

// fastConfig returns a configuration with short delays for tests.
func fastConfig(t testing.TB) binlog.Config {
	return binlog.Config{
		FlushInterval:   20 * time.Millisecond,
		Heartbeat:       time.Second,
		StandbyPoll:     50 * time.Millisecond,
		PublishTimeout:  5 * time.Second,
		RetryBackoff:    10 * time.Millisecond,
		MaxRetryBackoff: 200 * time.Millisecond,
		Logger:          testlog.New(t),
	}
}

func start(t testing.TB, db *testdb.SQLDB, pub broker.Publisher, cfg binlog.Config) *binlog.Relay {
	t.Helper()
	r, err := binlog.New(db.URL, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	logenginetest.Start(t, r)
	return r
}

// The suite's helpers, for the tests of what only MariaDB does.
var (
	stop       = logenginetest.Stop
	waitLen    = logenginetest.WaitLen
	eventually = logenginetest.Eventually
)

// add writes versions from..to of aggregate id, one transaction each.
func add(t testing.TB, db *testdb.SQLDB, id string, from, to int) []uuid.UUID {
	t.Helper()
	w := outbox.NewWriter(db.Driver)
	var ids []uuid.UUID
	for v := from; v <= to; v++ {
		ev, err := idem.NewEvent("order.changed.v1", "order", id, map[string]any{"version": v})
		if err != nil {
			t.Fatal(err)
		}
		ev.AggregateVersion = int64(v)
		if err := w.AddExec(context.Background(), db.Driver.Pool(), ev); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, ev.ID)
	}
	return ids
}

// TestPositionStored: the position the relay reports is the one stored in
// binlog_position, which idem status reads. (What every log relay does is
// in the conformance suite: conformance_test.go.)
func TestPositionStored(t *testing.T) {
	db := testdb.NewMariaDB(t)
	pub := memory.New()
	r := start(t, db, pub, fastConfig(t))
	eventually(t, "relay streaming", func() bool { return r.Stats().Streaming })
	add(t, db, "a", 1, 20)
	waitLen(t, pub, 20)
	eventually(t, "position stored", func() bool {
		p := r.Stats().Position
		return p != "" && db.Count(t, "binlog_position WHERE outbox_table = 'outbox' AND gtid_pos = ?", p) == 1 && r.Stats().Deleted == 20
	})
	st, err := db.Driver.Dialect().ReadStatus(context.Background(), db.Driver.Pool(), driver.StatusParams{})
	if err != nil || st.Outbox.LogPosition == "" || st.Outbox.LogPositionAt.IsZero() {
		t.Errorf("ReadStatus: %+v, %v", st.Outbox, err)
	}
}

// TestRolledBackAndOtherStatements: a rolled-back insert publishes
// nothing, updates and deletes are ignored, other tables too.
func TestRolledBackAndOtherStatements(t *testing.T) {
	db := testdb.NewMariaDB(t)
	pub := memory.New()
	start(t, db, pub, fastConfig(t))
	db.Exec(t, "CREATE TABLE other (id INT PRIMARY KEY, v VARCHAR(10))")
	tx, err := db.DB.Begin()
	if err != nil {
		t.Fatal(err)
	}
	w := outbox.NewWriter(db.Driver)
	ev, _ := idem.NewEvent("order.changed.v1", "order", "rolled-back", map[string]any{})
	if err := w.Add(context.Background(), tx, ev); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("INSERT INTO other VALUES (1, 'x')"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	db.Exec(t, "INSERT INTO other VALUES (2, 'y')")
	kept := add(t, db, "a", 1, 1)
	db.Exec(t, "UPDATE other SET v = 'z'")
	sentinel := add(t, db, "a", 2, 2)
	msgs := waitLen(t, pub, 2)
	logenginetest.CheckFirstOrder(t, msgs, append(kept, sentinel...))
	if len(msgs) != 2 {
		t.Errorf("%d messages, want 2: %v", len(msgs), msgs)
	}
}

// TestUnreadableRowQuarantined: a row that cannot become a message is
// quarantined in place and the stream goes on.
func TestUnreadableRowQuarantined(t *testing.T) {
	db := testdb.NewMariaDB(t)
	pub := memory.New()
	r := start(t, db, pub, fastConfig(t))
	db.Exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, headers)
VALUES (?, 'order', 'a', 'order.changed.v1', '{}', '[1,2]')`, uuid.NewString())
	sentinel := add(t, db, "a", 1, 1)
	msgs := waitLen(t, pub, 1)
	logenginetest.CheckFirstOrder(t, msgs, sentinel)
	eventually(t, "the bad row quarantined", func() bool {
		return db.Count(t, "outbox WHERE quarantined_at IS NOT NULL AND last_error LIKE '%headers%'") == 1
	})
	if s := r.Stats(); s.Unreadable != 1 || s.Quarantined != 1 {
		t.Errorf("stats: %+v", s)
	}
	// Fixed with SQL and re-driven (idem failed retry --relay clears
	// quarantined_at): published.
	db.Exec(t, `UPDATE outbox SET headers = '{}' WHERE quarantined_at IS NOT NULL`)
	var seq int64
	if err := db.DB.QueryRow(`SELECT seq FROM outbox WHERE quarantined_at IS NOT NULL`).Scan(&seq); err != nil {
		t.Fatal(err)
	}
	n, err := db.Driver.Dialect().RequeueQuarantined(context.Background(), db.Driver.Pool(), []int64{seq})
	if err != nil || n != 1 {
		t.Fatalf("requeue: %d, %v", n, err)
	}
	msgs = waitLen(t, pub, 2)
	if ev, err := idem.Decode(msgs[1]); err != nil || ev.AggregateID != "a" || ev.AggregateVersion != 0 {
		t.Fatalf("re-driven message: %+v, %v", ev, err)
	}
	eventually(t, "the re-driven row deleted", func() bool { return db.Count(t, "outbox") == 0 })
}

// TestDebeziumTableFromTheCommandLineClient: rows inserted by the mariadb
// client into a table with Debezium's five columns only are published.
func TestDebeziumTableFromTheCommandLineClient(t *testing.T) {
	db := testdb.NewMariaDB(t)
	db.Exec(t, `CREATE TABLE ext_outbox (
    id VARCHAR(64) NOT NULL PRIMARY KEY,
    aggregatetype VARCHAR(255) NOT NULL,
    aggregateid VARCHAR(255) NOT NULL,
    type VARCHAR(255) NOT NULL,
    payload JSON NULL)`)
	pub := memory.New()
	cfg := fastConfig(t)
	cfg.Tables.Outbox = "ext_outbox"
	start(t, db, pub, cfg)
	ids := []string{uuid.NewString(), uuid.NewString()}
	client := mariadbClient(t)
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pass, _ := u.User.Password()
	sqlText := fmt.Sprintf(`BEGIN;
INSERT INTO ext_outbox VALUES ('%s', 'customer', 'c-1', 'customer.created.v1', '{"name": "Ada"}');
INSERT INTO ext_outbox VALUES ('%s', 'customer', 'c-1', 'customer.renamed.v1', '{"name": "Ada L."}');
COMMIT;`, ids[0], ids[1])
	cmd := exec.Command(client, "--no-defaults", "--protocol=tcp", "-h", u.Hostname(), "-P", u.Port(),
		"-u", u.User.Username(), "-p"+pass, strings.TrimPrefix(u.Path, "/"), "-e", sqlText)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", client, err, out)
	}
	msgs := waitLen(t, pub, 2)
	for i, m := range msgs {
		ev, err := idem.Decode(m)
		if err != nil {
			t.Fatal(err)
		}
		if ev.ID.String() != ids[i] || ev.AggregateID != "c-1" || string(ev.Payload) == "" {
			t.Errorf("message %d: %+v", i, ev)
		}
	}
	eventually(t, "published rows deleted", func() bool { return db.Count(t, "ext_outbox") == 0 })
}

func mariadbClient(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"mariadb", "mysql"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("the mariadb command-line client is not installed (make test installs mariadb-server, which brings it)")
	return ""
}

// TestStartChecks: each start-up check refuses with its message.
func TestStartChecks(t *testing.T) {
	db := testdb.NewMariaDB(t)
	for _, c := range []struct{ param, want string }{
		{"binlog_format=%27STATEMENT%27", "binlog_format is STATEMENT"},
		{"binlog_format=%27MIXED%27", "binlog_format is MIXED: the relay reads rows, and with MIXED an insert of plain values is logged as a statement"},
		{"binlog_row_image=%27MINIMAL%27", "binlog_row_image is MINIMAL"},
	} {
		t.Run(c.param, func(t *testing.T) {
			sep := "?"
			if strings.Contains(db.URL, "?") {
				sep = "&"
			}
			r, err := binlog.New(db.URL+sep+c.param, memory.New(), fastConfig(t))
			if err != nil {
				t.Fatal(err)
			}
			err = r.Start(context.Background())
			if !errors.Is(err, binlog.ErrServerSettings) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Start: %v, want %q", err, c.want)
			}
		})
	}
	t.Run("privileges", func(t *testing.T) {
		user := "idem_norepl_" + strings.TrimPrefix(db.Name, "idem_t_")
		// The test server's root may grant privileges (idem may not).
		u, _ := url.Parse(db.URL)
		root := *u
		root.User = url.User("root")
		admin, err := mysql.Open(root.String())
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Close()
		for _, q := range []string{"CREATE USER '" + user + "'@'%' IDENTIFIED BY 'pw'",
			"GRANT ALL PRIVILEGES ON " + db.Name + ".* TO '" + user + "'@'%'"} {
			if _, err := admin.Exec(q); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() { db.Exec(t, "DROP USER '"+user+"'@'%'") })
		u.User = url.UserPassword(user, "pw")
		r, err := binlog.New(u.String(), memory.New(), fastConfig(t))
		if err != nil {
			t.Fatal(err)
		}
		err = r.Start(context.Background())
		if !errors.Is(err, binlog.ErrPrivileges) || !strings.Contains(err.Error(), "GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.*") {
			t.Fatalf("Start: %v", err)
		}
	})
	t.Run("no position table", func(t *testing.T) {
		db.Exec(t, "DROP TABLE binlog_position")
		r, err := binlog.New(db.URL, memory.New(), fastConfig(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "idem migrate") {
			t.Fatalf("Start: %v", err)
		}
	})
}

// TestPurgedPosition: a stored position the server's binlog no longer
// holds stops the relay with ErrPositionPurged; ResetPosition forgets it,
// and the next start publishes the rows waiting in the outbox.
func TestPurgedPosition(t *testing.T) {
	db := testdb.NewMariaDB(t)
	// A GTID of a server that never wrote this binlog: as if the files
	// holding it were purged.
	db.Exec(t, "INSERT INTO binlog_position (outbox_table, gtid_pos) VALUES ('outbox', '0-4000000-7')")
	waiting := add(t, db, "a", 1, 5)
	r, err := binlog.New(db.URL, memory.New(), fastConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	err = r.Start(context.Background())
	if !errors.Is(err, binlog.ErrPositionPurged) || !strings.Contains(err.Error(), "reset-position") {
		t.Fatalf("Start: %v", err)
	}
	if err := binlog.ResetPosition(context.Background(), db.URL, idem.Tables{}); err != nil {
		t.Fatal(err)
	}
	pub := memory.New()
	start(t, db, pub, fastConfig(t))
	logenginetest.CheckFirstOrder(t, waitLen(t, pub, 5), waiting)
}

// TestTextIDs: ids that are not UUIDs (Debezium's E42, 64 characters) are
// published under the UUID idem.EventID derives from them, with the id in
// idem-original-id, as every relay does; an id over 64 bytes (33 "é": the
// column takes 64 characters) is quarantined.
func TestTextIDs(t *testing.T) {
	db := testdb.NewMariaDB(t)
	pub := memory.New()
	r := start(t, db, pub, fastConfig(t))
	long := strings.Repeat("x", 64)
	for i, id := range []string{"E42", long, strings.Repeat("é", 33)} {
		db.Exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, aggregate_version)
VALUES (?, 'order', 'text-ids', 'order.changed.v1', '{}', ?)`, id, i+1)
	}
	sentinel := add(t, db, "after", 1, 1)
	msgs := waitLen(t, pub, 3)
	logenginetest.CheckFirstOrder(t, msgs, sentinel)
	var texts []idem.Message // the text-ids aggregate's, in order
	for _, m := range msgs {
		if m.Headers[idem.HeaderOriginalID] != "" || string(m.Key) == "text-ids" {
			texts = append(texts, m)
		}
	}
	if len(texts) != 2 {
		t.Fatalf("%d messages of the text ids, want 2: %v", len(texts), msgs)
	}
	for i, raw := range []string{"E42", long} {
		want, err := idem.EventID(raw)
		if err != nil {
			t.Fatal(err)
		}
		if texts[i].EventID != want || texts[i].Headers[idem.HeaderOriginalID] != raw {
			t.Errorf("message %d: id %s, header %q; want %s and %q", i, texts[i].EventID, texts[i].Headers[idem.HeaderOriginalID], want, raw)
		}
	}
	if want := "3f240152-ed00-547c-b98c-d4d274c69d5e"; texts[0].EventID.String() != want {
		t.Errorf("E42 published as %s, want %s", texts[0].EventID, want)
	}
	eventually(t, "the 66-byte id quarantined", func() bool {
		return db.Count(t, "outbox WHERE quarantined_at IS NOT NULL AND last_error LIKE '%66 bytes%'") == 1
	})
	if s := r.Stats(); s.Quarantined != 1 {
		t.Errorf("stats: %+v", s)
	}
}

// TestSavepoints: a transaction's savepoints do not end it, and the
// outbox rows a rollback to a savepoint undid are not published, whether
// the server dropped them from the binlog (InnoDB only) or logged the
// rollback (changes to a non-transactional table after the savepoint).
func TestSavepoints(t *testing.T) {
	db := testdb.NewMariaDB(t)
	db.Exec(t, "CREATE TABLE audit (n INT) ENGINE=MyISAM")
	pub := memory.New()
	start(t, db, pub, fastConfig(t))
	w := outbox.NewWriter(db.Driver)
	ctx := context.Background()
	var want []uuid.UUID
	for _, nonTransactional := range []bool{false, true} {
		tx, err := db.DB.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		exec := func(q string) {
			t.Helper()
			if _, err := tx.ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		ev := func(v int) idem.Event {
			e, err := idem.NewEvent("order.changed.v1", "order", fmt.Sprint("sp-", nonTransactional), map[string]any{"v": v})
			if err != nil {
				t.Fatal(err)
			}
			e.AggregateVersion = int64(v)
			return e
		}
		kept, undone, last := ev(1), ev(2), ev(3)
		if err := w.Add(ctx, tx, kept); err != nil {
			t.Fatal(err)
		}
		exec("SAVEPOINT sp1")
		if err := w.Add(ctx, tx, undone); err != nil {
			t.Fatal(err)
		}
		if nonTransactional {
			exec("INSERT INTO audit VALUES (1)")
		}
		exec("ROLLBACK TO SAVEPOINT sp1")
		exec("SAVEPOINT sp2")
		if err := w.Add(ctx, tx, last); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		want = append(want, kept.ID, last.ID)
	}
	sentinel := add(t, db, "after", 1, 1)
	msgs := waitLen(t, pub, 5)
	logenginetest.CheckFirstOrder(t, msgs, append(want, sentinel...))
	if len(msgs) != 5 {
		t.Errorf("%d messages, want 5 (the rows undone by the rollbacks to sp1 are not published)", len(msgs))
	}
}

// TestColumnNamesFromInformationSchema: when binlog_row_metadata leaves
// FULL while the relay runs, the rows come without column names: the relay
// takes them from information_schema and goes on.
func TestColumnNamesFromInformationSchema(t *testing.T) {
	testdb.MariaDBExclusive(t)
	db := testdb.NewMariaDB(t)
	pub := memory.New()
	r := start(t, db, pub, fastConfig(t))
	eventually(t, "the relay streaming", func() bool { return r.Stats().Streaming })
	db.Exec(t, "SET GLOBAL binlog_row_metadata = 'MINIMAL'")
	t.Cleanup(func() { db.Exec(t, "SET GLOBAL binlog_row_metadata = 'FULL'") })
	ids := add(t, db, "minimal", 1, 3)
	msgs := waitLen(t, pub, 3)
	logenginetest.CheckFirstOrder(t, msgs, ids)
	if s := r.Stats(); s.Unreadable != 0 {
		t.Errorf("stats: %+v", s)
	}
}

// TestStatementLoggedInsert: an insert logged as a statement (a writer's
// session with binlog_format STATEMENT) cannot be read as rows: the relay
// says so, counts it, and goes on; the row stays in the table.
func TestStatementLoggedInsert(t *testing.T) {
	db := testdb.NewMariaDB(t)
	// Debezium's five columns, as a foreign writer's table. (Under MIXED,
	// idem's table would be logged as rows: MariaDB deems its
	// UTC_TIMESTAMP defaults unsafe for statements; under STATEMENT it is
	// logged as a statement too.)
	db.Exec(t, `CREATE TABLE ext_outbox (id VARCHAR(64) NOT NULL PRIMARY KEY, aggregatetype VARCHAR(255) NOT NULL,
    aggregateid VARCHAR(255) NOT NULL, type VARCHAR(255) NOT NULL, payload JSON NULL)`)
	pub := memory.New()
	cfg := fastConfig(t)
	cfg.Tables.Outbox = "ext_outbox"
	r := start(t, db, pub, cfg)
	ctx := context.Background()
	conn, err := db.DB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, q := range []string{"SET SESSION binlog_format = 'STATEMENT'",
		"INSERT INTO ext_outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('" + uuid.NewString() + "', 'order', 'st', 'order.changed.v1', '{}')",
		"SET SESSION binlog_format = 'ROW'",
		"INSERT INTO ext_outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('" + uuid.NewString() + "', 'order', 'after', 'order.changed.v1', '{}')"} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	msgs := waitLen(t, pub, 1)
	if ev, err := idem.Decode(msgs[0]); err != nil || ev.AggregateID != "after" {
		t.Fatalf("published %+v, %v; want the row logged as rows", ev, err)
	}
	if s := r.Stats(); s.Unreadable != 1 {
		t.Errorf("stats: %+v", s)
	}
	if n := db.Count(t, "ext_outbox WHERE aggregateid = 'st'"); n != 1 {
		t.Errorf("%d statement-logged rows left in the outbox, want 1", n)
	}
}

// TestFirstPositionStored: the first start on an empty outbox stores its
// position at once, so that what is written while the relay is stopped is
// read from the binlog at the next start, with Delete = KeepRows too (the
// rows waiting then are not published from the table).
func TestFirstPositionStored(t *testing.T) {
	for _, mode := range []logrelay.DeleteMode{logrelay.DeletePublished, logrelay.KeepRows} {
		t.Run(mode.String(), func(t *testing.T) {
			db := testdb.NewMariaDB(t)
			pub := memory.New()
			cfg := fastConfig(t)
			cfg.Delete = mode
			r := start(t, db, pub, cfg)
			eventually(t, "the position stored", func() bool { return db.Count(t, "binlog_position") == 1 })
			stop(t, r)
			ids := add(t, db, "a", 1, 5)
			start(t, db, pub, cfg)
			logenginetest.CheckFirstOrder(t, waitLen(t, pub, 5), ids)
		})
	}
}
