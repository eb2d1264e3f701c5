package webhookin_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/inbox/webhookin"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testlog"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// paymentTable is the effect of the tests' handler: one row per event
// applied, with the sender's id.
const paymentTable = `CREATE TABLE payment (event_id VARCHAR(64) NOT NULL PRIMARY KEY, original_id VARCHAR(64) NOT NULL)`

// env is a payments service receiving Standard Webhooks: a consumer on a
// fresh database, its handler behind an HTTP server.
type env struct {
	dialect string // "sqlite", "postgres", "mysql"
	db      *sql.DB
	dbName  string // MariaDB's database
	drv     driver.Driver[*sql.Tx]
	clock   *idemtest.Clock
	c       *inbox.Consumer[*sql.Tx]
	h       *webhookin.Handler
	url     string

	mu sync.Mutex
	// hook, when set, runs in the handler after the payment's insert; its
	// error is the handler's.
	hook func(ctx context.Context, tx *sql.Tx, ev idem.Event) error
}

// eachDB runs fn on SQLite, PostgreSQL (database/sql) and MariaDB, in
// parallel subtests.
func eachDB(t *testing.T, fn func(*testing.T, *env), opts ...func(*inbox.Config)) {
	t.Helper()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		s := testdb.NewSQLite(t)
		fn(t, newEnv(t, "sqlite", s.DB, "", s.Driver, opts...))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		pg := testdb.NewPostgres(t)
		fn(t, newEnv(t, "postgres", pg.DB, pg.Schema, postgres.NewSQL(pg.DB), opts...))
	})
	t.Run("mariadb", func(t *testing.T) {
		t.Parallel()
		m := testdb.NewMariaDB(t)
		fn(t, newEnv(t, "mysql", m.DB, m.Name, m.Driver, opts...))
	})
}

func newEnv(t *testing.T, dialect string, db *sql.DB, name string, drv driver.Driver[*sql.Tx], opts ...func(*inbox.Config)) *env {
	t.Helper()
	e := &env{dialect: dialect, db: db, dbName: name, drv: drv, clock: idemtest.NewClock()}
	e.exec(t, paymentTable)
	cfg := inbox.Config{Name: "payments", Logger: testlog.New(t), Now: e.clock.Now}
	for _, o := range opts {
		o(&cfg)
	}
	var err error
	e.c, err = inbox.New(drv, cfg)
	if err != nil {
		t.Fatal(err)
	}
	insert := `INSERT INTO payment (event_id, original_id) VALUES (?, ?)`
	if dialect == "postgres" {
		insert = `INSERT INTO payment (event_id, original_id) VALUES ($1, $2)`
	}
	e.c.Handle("invoice.paid", func(ctx context.Context, tx *sql.Tx, ev idem.Event) error {
		if _, err := tx.ExecContext(ctx, insert, ev.ID.String(), ev.Headers[idem.HeaderOriginalID]); err != nil {
			return err
		}
		e.mu.Lock()
		hook := e.hook
		e.mu.Unlock()
		if hook != nil {
			return hook(ctx, tx, ev)
		}
		return nil
	})
	e.h, err = webhookin.New(e.c, webhookin.Config{
		Provider: webhookin.StandardWebhooks{Secrets: []string{swSecretNext, swSecret}},
		Logger:   testlog.New(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(e.h)
	t.Cleanup(srv.Close)
	e.url = srv.URL
	return e
}

// setHook sets what the handler does after its insert.
func (e *env) setHook(hook func(ctx context.Context, tx *sql.Tx, ev idem.Event) error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.hook = hook
}

func (e *env) exec(t *testing.T, query string, args ...any) {
	t.Helper()
	if _, err := e.db.ExecContext(context.Background(), query, args...); err != nil {
		t.Fatalf("exec %q: %v", query, err)
	}
}

func (e *env) count(t *testing.T, fromWhere string) int {
	t.Helper()
	var n int
	if err := e.db.QueryRowContext(context.Background(), "SELECT COUNT(*) FROM "+fromWhere).Scan(&n); err != nil {
		t.Fatalf("count %q: %v", fromWhere, err)
	}
	return n
}

// stored returns how many rows each of idem's tables and the effect hold.
func (e *env) stored(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, table := range []string{"payment", "processed_event", "failed_message", "delivery_attempt"} {
		out[table] = e.count(t, table)
	}
	return out
}

// session returns the identifier of tx's connection, for waiting (0 on
// SQLite, whose one connection is the lock).
func (e *env) session(ctx context.Context, tx *sql.Tx) (int64, error) {
	var q string
	switch e.dialect {
	case "postgres":
		q = `SELECT pg_backend_pid()`
	case "mysql":
		q = `SELECT CONNECTION_ID()`
	default:
		return 0, nil
	}
	var id int64
	err := tx.QueryRowContext(ctx, q).Scan(&id)
	return id, err
}

// waiting reports whether another delivery waits for the transaction of
// the session first: a lock wait on PostgreSQL and MariaDB; on SQLite, a
// wait for its one connection since waitsBefore.
func (e *env) waiting(t *testing.T, first int64, waitsBefore int64) bool {
	t.Helper()
	ctx := context.Background()
	var n int
	var err error
	switch e.dialect {
	case "postgres":
		err = e.db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1::integer = ANY(pg_blocking_pids(pid))`, first).Scan(&n)
	case "mysql":
		// MariaDB does not always list a transaction blocked on a
		// duplicate-key check as waiting: an insert of a marker still
		// running on another session of the test's database is one.
		if n, err = mysql.LockWaits(ctx, e.db, e.dbName); err == nil && n == 0 {
			err = e.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.PROCESSLIST
WHERE DB = ? AND ID <> ? AND ID <> CONNECTION_ID() AND INFO LIKE 'INSERT INTO %processed_event%'`, e.dbName, first).Scan(&n)
		}
	default:
		return e.db.Stats().WaitCount > waitsBefore
	}
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// answer is the handler's answer to a request.
type answer struct {
	status     int
	outcome    string
	err        string
	retryAfter string
}

// post sends body with header to the handler.
func (e *env) post(t *testing.T, header http.Header, body []byte) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = header
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out struct{ Outcome, Error string }
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("answer %d %q: %v", resp.StatusCode, raw, err)
	}
	return answer{resp.StatusCode, out.Outcome, out.Error, resp.Header.Get("Retry-After")}
}

// invoice returns the body of an invoice.paid webhook and its sender's id.
func invoice(n int) (string, []byte) {
	return "msg_2KWPBgLlAfxdpx2AI54pPJ85f4" + strconv.Itoa(n),
		[]byte(`{"type":"invoice.paid","timestamp":"2026-01-02T08:00:00Z","data":{"invoice":"in_` + strconv.Itoa(n) + `","amount":1999}}`)
}

// newConsumerForConfig returns a consumer on a fresh SQLite database, for
// the checks of New.
func newConsumerForConfig(t *testing.T) *inbox.Consumer[*sql.Tx] {
	t.Helper()
	c, err := inbox.New(testdb.NewSQLite(t).Driver, inbox.Config{Name: "payments", Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// signedNow signs with the sender's current secret, now.
func signedNow(id string, body []byte) http.Header { return signSW(id, time.Now(), body, swSecretNext) }
