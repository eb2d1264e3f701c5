package mysqlrepl_test

// The tests against the test MariaDB server (IDEM_TEST_MARIADB_URL: run
// them with `make test`, or in the shell of
// `IDEM_TEST_SHELL=1 IDEM_TEST_SERVERS=mariadb bash scripts/test.sh`). The
// server is shared with other packages' tests: each test works in a
// database of its own, reads the binlog from the position before its own
// writes, and skips the other databases' events.

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/mysqlrepl"
	"github.com/idem-go/idem/internal/testdb"
)

// config returns a Config for the test server, with a ServerID of its own
// (the server ends an older dump of the same id).
func config(t testing.TB) mysqlrepl.Config {
	t.Helper()
	u, err := url.Parse(testdb.MariaDBURL(t))
	if err != nil {
		t.Fatalf("parse %s: %v", testdb.MariaDBURLEnv, err)
	}
	pw, _ := u.User.Password()
	return mysqlrepl.Config{
		Addr:     u.Host,
		User:     u.User.Username(),
		Password: pw,
		ServerID: 1_000_000 + rand.Uint32N(1<<30),
	}
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

func dial(t testing.TB, cfg mysqlrepl.Config) *mysqlrepl.Conn {
	t.Helper()
	c, err := mysqlrepl.Dial(ctx(t), cfg)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	// Fail rather than hang if an expected event never comes.
	if err := c.SetDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	return c
}

func exec(t testing.TB, db interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, query string, args ...any) {
	t.Helper()
	if _, err := db.ExecContext(ctx(t), query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

func binlogPos(t testing.TB, db *sql.DB) string {
	t.Helper()
	var pos string
	if err := db.QueryRowContext(ctx(t), "SELECT @@gtid_binlog_pos").Scan(&pos); err != nil {
		t.Fatalf("read @@gtid_binlog_pos: %v", err)
	}
	return pos
}

// group is an event group of the test's database: its GTID, rows events
// and whether its XID came.
type group struct {
	gtid mysqlrepl.GTID
	rows []*mysqlrepl.RowsEvent
	xid  bool
}

// readGroups reads events until n groups touching schema have committed,
// and returns those groups and the first events of the stream.
func readGroups(t *testing.T, c *mysqlrepl.Conn, schema string, n int) (groups []*group, first []mysqlrepl.Event) {
	t.Helper()
	var cur *group
	for len(groups) < n || !groups[n-1].xid {
		ev, err := c.ReadEvent()
		if err != nil {
			t.Fatalf("ReadEvent after %d groups: %v", len(groups), err)
		}
		if len(first) < 4 {
			first = append(first, ev)
		}
		switch e := ev.(type) {
		case *mysqlrepl.GTIDEvent:
			cur = &group{gtid: e.GTID()}
		case *mysqlrepl.RowsEvent:
			if e.Table.Schema != schema {
				continue
			}
			if cur == nil {
				t.Fatal("rows event before any GTID event")
			}
			if len(cur.rows) == 0 {
				groups = append(groups, cur)
			}
			cur.rows = append(cur.rows, e)
		case *mysqlrepl.XIDEvent:
			if cur != nil && len(cur.rows) > 0 {
				cur.xid = true
			}
			cur = nil
		}
	}
	return groups, first
}

func lastGTID(t *testing.T, conn *sql.Conn) mysqlrepl.GTID {
	t.Helper()
	var s string
	if err := conn.QueryRowContext(ctx(t), "SELECT @@last_gtid").Scan(&s); err != nil {
		t.Fatalf("read @@last_gtid: %v", err)
	}
	g, err := mysqlrepl.ParseGTID(s)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

const allTypesTable = `CREATE TABLE t (
	id BIGINT UNSIGNED NOT NULL PRIMARY KEY,
	ti TINYINT, uti TINYINT UNSIGNED, si SMALLINT, mi MEDIUMINT, umi MEDIUMINT UNSIGNED,
	i INT, ui INT UNSIGNED, bi BIGINT, y YEAR, f FLOAT, d DOUBLE,
	dec1 DECIMAL(10,2), dec2 DECIMAL(65,30), udec DECIMAL(5,2) UNSIGNED,
	da DATE, tm TIME, tm3 TIME(3), dt DATETIME, dt3 DATETIME(3), dt6 DATETIME(6),
	ts TIMESTAMP NULL, ts6 TIMESTAMP(6) NULL,
	vc VARCHAR(50), vcl VARCHAR(300), ch CHAR(10), bn BINARY(4), vb VARBINARY(20),
	tx TEXT, bl BLOB, mb MEDIUMBLOB, lb LONGBLOB, j JSON,
	e ENUM('a','b','c'), s SET('x','y','z'), bt BIT(10), ubi BIGINT UNSIGNED
) CHARACTER SET utf8mb4`

const allTypesInsert = `INSERT INTO t VALUES (1,
	-128, 255, -32768, -8388608, 16777215,
	-2147483648, 4294967295, -9223372036854775808, 2024, 1.5, -2.25,
	-12345678.90, '12345678901234567890.123456789012345678901234567890', 999.99,
	'2024-02-29', '-838:59:59', '12:34:56.789', '2024-01-02 03:04:05', '1000-01-01 00:00:00.001', '9999-12-31 23:59:59.999999',
	'2038-01-19 03:14:07', '2024-05-06 07:08:09.123456',
	'héllo', REPEAT('x', 300), 'abc', X'01020304', X'00ff',
	'text', X'000102', 'medium', 'long', '{"a": [1, 2]}',
	'b', 'x,z', b'1010101010', 18446744073709551615)`

func TestDumpRows(t *testing.T) {
	t.Parallel()
	db := testdb.NewMariaDB(t, testdb.Options{NoMigrate: true})
	exec(t, db.DB, allTypesTable)
	pos := binlogPos(t, db.DB)

	cfg := config(t)
	c := dial(t, cfg)
	if v := c.ServerVersion(); !strings.Contains(v, "MariaDB") || strings.HasPrefix(v, "5.5.5-") {
		t.Errorf("ServerVersion %q", v)
	}
	if err := c.StartDump(ctx(t), pos); err != nil {
		t.Fatalf("StartDump(%q): %v", pos, err)
	}

	conn, err := db.DB.Conn(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	exec(t, conn, "SET time_zone = '+00:00'")
	exec(t, conn, "BEGIN")
	exec(t, conn, allTypesInsert)
	exec(t, conn, "INSERT INTO t (id) VALUES (2)")
	exec(t, conn, "COMMIT")
	g1 := lastGTID(t, conn)
	exec(t, conn, "UPDATE t SET vc = 'changed' WHERE id = 1")
	g2 := lastGTID(t, conn)
	exec(t, conn, "DELETE FROM t WHERE id = 2")
	g3 := lastGTID(t, conn)

	groups, first := readGroups(t, c, db.Name, 3)

	// What MariaDB sends first: a fake ROTATE naming the binlog, then the
	// file's FORMAT_DESCRIPTION (with checksums: CRC32 is the default).
	if r, ok := first[0].(*mysqlrepl.RotateEvent); !ok || r.Flags&mysqlrepl.FlagArtificial == 0 || r.NextPos != 0 || r.File == "" || r.Pos != 4 {
		t.Errorf("first event: %#v, want the fake ROTATE", first[0])
	}
	if f, ok := first[1].(*mysqlrepl.FormatDescriptionEvent); !ok || !f.Checksum || !strings.Contains(f.ServerVersion, "MariaDB") {
		t.Errorf("second event: %#v, want a FORMAT_DESCRIPTION with checksums", first[1])
	}
	if c.Parser().File() == "" {
		t.Error("Parser().File() is empty")
	}

	for i, want := range []mysqlrepl.GTID{g1, g2, g3} {
		if groups[i].gtid != want {
			t.Errorf("group %d: GTID %v, want %v", i, groups[i].gtid, want)
		}
	}

	// The table map: names, types, signedness from binlog_row_metadata=FULL.
	tm := groups[0].rows[0].Table
	if tm.Schema != db.Name || tm.Table != "t" || !reflect.DeepEqual(tm.PrimaryKey, []int{0}) {
		t.Errorf("table map %s.%s, primary key %v", tm.Schema, tm.Table, tm.PrimaryKey)
	}
	names := []string{"id", "ti", "uti", "si", "mi", "umi", "i", "ui", "bi", "y", "f", "d", "dec1", "dec2", "udec",
		"da", "tm", "tm3", "dt", "dt3", "dt6", "ts", "ts6", "vc", "vcl", "ch", "bn", "vb", "tx", "bl", "mb", "lb", "j", "e", "s", "bt", "ubi"}
	unsigned := map[string]bool{"y": true, "id": true, "uti": true, "umi": true, "ui": true, "udec": true, "ubi": true}
	if len(tm.Columns) != len(names) {
		t.Fatalf("%d columns, want %d", len(tm.Columns), len(names))
	}
	for i, col := range tm.Columns {
		if col.Name != names[i] || col.Unsigned != unsigned[names[i]] || col.Nullable != (i != 0) {
			t.Errorf("column %d: %+v", i, col)
		}
	}
	if e := tm.Columns[33]; e.RealType() != mysqlrepl.TypeEnum || !reflect.DeepEqual(e.EnumValues, []string{"a", "b", "c"}) {
		t.Errorf("enum column: %+v", e)
	}
	if s := tm.Columns[34]; s.RealType() != mysqlrepl.TypeSet || !reflect.DeepEqual(s.SetValues, []string{"x", "y", "z"}) {
		t.Errorf("set column: %+v", s)
	}

	row1 := []any{uint64(1),
		int64(-128), uint64(255), int64(-32768), int64(-8388608), uint64(16777215),
		int64(-2147483648), uint64(4294967295), int64(-9223372036854775808), int64(2024), 1.5, -2.25,
		"-12345678.90", "12345678901234567890.123456789012345678901234567890", "999.99",
		"2024-02-29", "-838:59:59", "12:34:56.789",
		time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC), time.Date(1000, 1, 1, 0, 0, 0, 1e6, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC),
		time.Unix(2147483647, 0).UTC(), time.Date(2024, 5, 6, 7, 8, 9, 123456000, time.UTC),
		[]byte("héllo"), bytes.Repeat([]byte("x"), 300), []byte("abc"), []byte{1, 2, 3, 4}, []byte{0, 0xff},
		[]byte("text"), []byte{0, 1, 2}, []byte("medium"), []byte("long"), []byte(`{"a": [1, 2]}`),
		int64(2), uint64(5), uint64(0x2aa), uint64(18446744073709551615)}
	row2 := make([]any, len(names))
	row2[0] = uint64(2)

	// Group 1: the two inserts of one transaction.
	var inserted [][]any
	for _, r := range groups[0].rows {
		if r.Kind != mysqlrepl.Insert || r.Partial {
			t.Errorf("group 1: a %v event (partial %v)", r.Kind, r.Partial)
		}
		rows, err := r.Rows()
		if err != nil {
			t.Fatalf("Rows: %v", err)
		}
		inserted = append(inserted, rows...)
	}
	if len(inserted) != 2 {
		t.Fatalf("%d rows inserted, want 2", len(inserted))
	}
	for i, want := range [][]any{row1, row2} {
		for j := range want {
			if !reflect.DeepEqual(inserted[i][j], want[j]) {
				t.Errorf("row %d, column %s: got %#v (%T), want %#v (%T)", i+1, names[j], inserted[i][j], inserted[i][j], want[j], want[j])
			}
		}
	}

	// Group 2: the update, before and after.
	if len(groups[1].rows) != 1 || groups[1].rows[0].Kind != mysqlrepl.Update {
		t.Fatalf("group 2: %v", groups[1].rows)
	}
	before, after, err := groups[1].rows[0].Images()
	if err != nil {
		t.Fatal(err)
	}
	row1b := append([]any(nil), row1...)
	row1b[23] = []byte("changed")
	if !reflect.DeepEqual(before, [][]any{row1}) || !reflect.DeepEqual(after, [][]any{row1b}) {
		t.Errorf("update:\nbefore %v\n after %v", before, after)
	}

	// Group 3: the delete.
	if len(groups[2].rows) != 1 || groups[2].rows[0].Kind != mysqlrepl.Delete {
		t.Fatalf("group 3: %v", groups[2].rows)
	}
	if rows, err := groups[2].rows[0].Rows(); err != nil || !reflect.DeepEqual(rows, [][]any{row2}) {
		t.Errorf("delete: %v %v", rows, err)
	}

	// Every transaction's GTID is now in a position built from the stream.
	var p mysqlrepl.Position
	for _, g := range groups {
		p.Update(g.gtid)
	}
	if !p.Contains(g1) || !p.Contains(g3) {
		t.Errorf("position %s", p)
	}
}

// TestLargeRow: a 20 MiB row event, which the server sends in two packets
// (16 MiB each at most) that ReadEvent joins.
func TestLargeRow(t *testing.T) {
	t.Parallel()
	db := testdb.NewMariaDB(t, testdb.Options{NoMigrate: true})
	exec(t, db.DB, "CREATE TABLE big (id INT PRIMARY KEY, a LONGBLOB, b LONGBLOB)")
	pos := binlogPos(t, db.DB)
	c := dial(t, config(t))
	if err := c.StartDump(ctx(t), pos); err != nil {
		t.Fatal(err)
	}
	// Each value stays under max_allowed_packet (16 MiB on the test
	// server); the row is 20 MiB.
	const half = 10 << 20
	exec(t, db.DB, "INSERT INTO big VALUES (1, REPEAT('a', ?), REPEAT('b', ?))", half, half)
	groups, _ := readGroups(t, c, db.Name, 1)
	r := groups[0].rows[0]
	if r.Size < 20<<20 {
		t.Errorf("event of %d bytes, want more than 20 MiB", r.Size)
	}
	rows, err := r.Rows()
	if err != nil {
		t.Fatal(err)
	}
	a, b := rows[0][1].([]byte), rows[0][2].([]byte)
	if len(rows) != 1 || !bytes.Equal(a, bytes.Repeat([]byte("a"), half)) || !bytes.Equal(b, bytes.Repeat([]byte("b"), half)) {
		t.Errorf("got %d rows, a of %d bytes, b of %d bytes", len(rows), len(a), len(b))
	}
}

// TestUnavailablePosition: what MariaDB answers for positions it does not
// have. A sequence past the end of a domain the binlog has is error 1236;
// so is a GTID of another server at a sequence the domain went past (a
// diverged replica). A domain the binlog never had is not an error: the
// server streams that domain from the oldest binlog.
func TestUnavailablePosition(t *testing.T) {
	t.Parallel()
	db := testdb.NewMariaDB(t, testdb.Options{NoMigrate: true})
	exec(t, db.DB, "CREATE TABLE x (id INT PRIMARY KEY)")
	exec(t, db.DB, "INSERT INTO x VALUES (1)")
	pos, err := mysqlrepl.ParsePosition(binlogPos(t, db.DB))
	if err != nil {
		t.Fatal(err)
	}
	cur := pos.GTIDs()[0]

	future := pos
	future.Update(mysqlrepl.GTID{Domain: cur.Domain, Server: cur.Server, Seq: cur.Seq + 1_000_000_000})
	diverged := pos
	diverged.Update(mysqlrepl.GTID{Domain: cur.Domain, Server: cur.Server + 1000, Seq: 1})
	for _, tc := range []struct {
		pos  mysqlrepl.Position
		text string
	}{
		{future, "which is not in the master's binlog"},
		{diverged, "diverged"},
	} {
		c := dial(t, config(t))
		if err := c.StartDump(ctx(t), tc.pos.String()); err != nil {
			t.Fatal(err)
		}
		var err error
		for err == nil {
			_, err = c.ReadEvent()
		}
		var se *mysqlrepl.ServerError
		if !mysqlrepl.IsPurged(err) || !errors.As(err, &se) || !strings.Contains(se.Message, tc.text) {
			t.Errorf("position %s: %v, want error 1236 saying %q", tc.pos, err, tc.text)
		}
	}

	// A domain the binlog never had: the dump starts, from the oldest
	// binlog.
	c := dial(t, config(t))
	unknown := fmt.Sprintf("%d-77-5", 1<<31+rand.Uint32N(1<<30))
	if err := c.StartDump(ctx(t), unknown); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := c.ReadEvent(); err != nil {
			t.Fatalf("position %s: %v", unknown, err)
		}
	}
}

func TestAuthentication(t *testing.T) {
	t.Parallel()
	cfg := config(t)
	cfg.Password = "wrong"
	_, err := mysqlrepl.Dial(ctx(t), cfg)
	var se *mysqlrepl.ServerError
	if !errors.As(err, &se) || se.Code != 1045 || se.State != "28000" || !strings.HasPrefix(err.Error(), "mysql: Error 1045 (28000): ") {
		t.Errorf("wrong password: %v, want *ServerError 1045", err)
	}

	// A user of another plugin: the server asks to switch to it
	// (AuthSwitchRequest), refused with the plugin's name. (The plugin
	// is loaded once for all runs: INSTALL ... IF NOT EXISTS.)
	db := testdb.NewMariaDB(t, testdb.Options{NoMigrate: true})
	exec(t, db.DB, "INSTALL PLUGIN IF NOT EXISTS ed25519 SONAME 'auth_ed25519'")
	user := "idem_ed_" + strings.TrimPrefix(db.Name, "idem_t_")
	exec(t, db.DB, "CREATE USER '"+user+"'@'%' IDENTIFIED VIA ed25519 USING PASSWORD('secret')")
	t.Cleanup(func() { exec(t, db.DB, "DROP USER '"+user+"'@'%'") })
	cfg = config(t)
	cfg.User, cfg.Password = user, "secret"
	_, err = mysqlrepl.Dial(ctx(t), cfg)
	if err == nil || !strings.Contains(err.Error(), "client_ed25519") || !strings.Contains(err.Error(), "mysql_native_password") {
		t.Errorf("ed25519 user: %v, want an error naming both plugins", err)
	}
}

func TestExecAndHeartbeat(t *testing.T) {
	t.Parallel()
	cfg := config(t)
	cfg.Heartbeat = 50 * time.Millisecond
	c := dial(t, cfg)
	if err := c.Exec(ctx(t), "SET @idem = 1"); err != nil {
		t.Errorf("SET: %v", err)
	}
	if err := c.Exec(ctx(t), "SELECT 1, NULL, 'x' UNION ALL SELECT 2, 3, 'y'"); err != nil {
		t.Errorf("SELECT: %v", err)
	}
	var se *mysqlrepl.ServerError
	if err := c.Exec(ctx(t), "SELEC 1"); !errors.As(err, &se) || se.Code != 1064 {
		t.Errorf("syntax error: %v, want *ServerError 1064", err)
	}
	// The connection is still usable after an error from the server.
	if err := c.Exec(ctx(t), "SET @idem = 2"); err != nil {
		t.Errorf("SET after an error: %v", err)
	}

	db := testdb.NewMariaDB(t, testdb.Options{NoMigrate: true})
	if err := c.StartDump(ctx(t), binlogPos(t, db.DB)); err != nil {
		t.Fatal(err)
	}
	if err := c.Exec(ctx(t), "SET @idem = 3"); err == nil {
		t.Error("Exec after StartDump: no error")
	}
	// With nothing to send, the server sends heartbeats (other tests may
	// write meanwhile: read until one comes, within the deadline).
	for {
		ev, err := c.ReadEvent()
		if err != nil {
			t.Fatalf("waiting for a heartbeat: %v", err)
		}
		if h, ok := ev.(*mysqlrepl.HeartbeatEvent); ok {
			if h.File == "" || h.NextPos == 0 {
				t.Errorf("heartbeat %+v", h)
			}
			break
		}
	}

	// Close interrupts a blocked ReadEvent.
	done := make(chan error)
	go func() {
		for {
			if _, err := c.ReadEvent(); err != nil {
				done <- err
				return
			}
		}
	}()
	_ = c.Close()
	if err := <-done; err == nil {
		t.Error("ReadEvent after Close: no error")
	}
}

func TestDialErrors(t *testing.T) {
	t.Parallel()
	for _, cfg := range []mysqlrepl.Config{
		{Addr: "127.0.0.1:1", ServerID: 0},
		{Addr: "", ServerID: 5},
		{Addr: "x", Network: "udp", ServerID: 5},
	} {
		if _, err := mysqlrepl.Dial(ctx(t), cfg); err == nil || !strings.HasPrefix(err.Error(), "idem: mysqlrepl: Config.") {
			t.Errorf("Dial(%+v): %v, want a Config error", cfg, err)
		}
	}
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := mysqlrepl.Dial(canceled, config(t)); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled Dial: %v", err)
	}
}
