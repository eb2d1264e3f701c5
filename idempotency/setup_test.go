package idempotency_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/idempotency"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/outbox"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashChildEnv) != "" {
		os.Exit(crashChild())
	}
	goleak.VerifyTestMain(m)
}

// testDB is a fresh, migrated database with a widget table, on one
// connection API.
type testDB[TTx any] struct {
	drv     driver.Driver[TTx]
	dialect string // "postgres", "mysql", "sqlite"
	url     string // for child processes: a PostgreSQL or MariaDB URL, or the SQLite file
}

const widgetTable = `CREATE TABLE widget (id VARCHAR(64) NOT NULL PRIMARY KEY, name VARCHAR(100) NOT NULL)`

// eachDB runs sqlFn on SQLite, PostgreSQL (database/sql) and MariaDB, and
// pgxFn (when not nil) on PostgreSQL through pgx, in parallel subtests.
func eachDB(t *testing.T, sqlFn func(*testing.T, testDB[*sql.Tx]), pgxFn func(*testing.T, testDB[pgx.Tx])) {
	t.Helper()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		s := testdb.NewSQLite(t)
		db := testDB[*sql.Tx]{drv: s.Driver, dialect: "sqlite", url: s.URL}
		db.exec(t, widgetTable)
		sqlFn(t, db)
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		pg := testdb.NewPostgres(t)
		db := testDB[*sql.Tx]{drv: postgres.NewSQL(pg.DB), dialect: "postgres", url: pg.URL}
		db.exec(t, widgetTable)
		sqlFn(t, db)
	})
	if pgxFn != nil {
		t.Run("postgres-pgx", func(t *testing.T) {
			t.Parallel()
			pg := testdb.NewPostgres(t)
			db := testDB[pgx.Tx]{drv: pg.Driver, dialect: "postgres", url: pg.URL}
			db.exec(t, widgetTable)
			pgxFn(t, db)
		})
	}
	t.Run("mariadb", func(t *testing.T) {
		t.Parallel()
		m := testdb.NewMariaDB(t)
		db := testDB[*sql.Tx]{drv: m.Driver, dialect: "mysql", url: m.URL}
		db.exec(t, widgetTable)
		sqlFn(t, db)
	})
}

// eachPostgres runs sqlFn on PostgreSQL through database/sql and pgxFn
// through pgx, in parallel subtests.
func eachPostgres(t *testing.T, sqlFn func(*testing.T, testDB[*sql.Tx]), pgxFn func(*testing.T, testDB[pgx.Tx])) {
	t.Helper()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		pg := testdb.NewPostgres(t)
		db := testDB[*sql.Tx]{drv: postgres.NewSQL(pg.DB), dialect: "postgres", url: pg.URL}
		db.exec(t, widgetTable)
		sqlFn(t, db)
	})
	t.Run("postgres-pgx", func(t *testing.T) {
		t.Parallel()
		pg := testdb.NewPostgres(t)
		db := testDB[pgx.Tx]{drv: pg.Driver, dialect: "postgres", url: pg.URL}
		db.exec(t, widgetTable)
		pgxFn(t, db)
	})
}

// bind rewrites ? placeholders as $n for PostgreSQL.
func (db testDB[TTx]) bind(query string) string {
	if db.dialect != "postgres" {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (db testDB[TTx]) exec(t testing.TB, query string, args ...any) {
	t.Helper()
	if _, err := db.drv.Pool().Exec(context.Background(), db.bind(query), args...); err != nil {
		t.Fatalf("exec %q: %v", query, err)
	}
}

func (db testDB[TTx]) count(t testing.TB, fromWhere string, args ...any) int {
	t.Helper()
	var n int
	if err := driver.QueryRow(context.Background(), db.drv.Pool(), db.bind("SELECT COUNT(*) FROM "+fromWhere), args, &n); err != nil {
		t.Fatalf("count %q: %v", fromWhere, err)
	}
	return n
}

// widgets is an application whose POST /widgets writes a widget and its
// outbox event, and completes the request's key, in one transaction.
type widgets[TTx any] struct {
	db   testDB[TTx]
	keys *idempotency.Keys[TTx]
	out  *outbox.Writer[TTx]
	// entered, when not nil, receives a value when a request reaches the
	// handler, which then waits for gate before it begins its
	// transaction.
	entered chan struct{}
	gate    chan struct{}
	// failAfterComplete makes the handler roll back after completing the
	// key and answer 500.
	failAfterComplete bool
	// beforeCommit, when not nil, runs after the completion and before the
	// commit.
	beforeCommit func()
}

func newWidgets[TTx any](t *testing.T, db testDB[TTx], cfg idempotency.Config) *widgets[TTx] {
	t.Helper()
	keys, err := idempotency.New(db.drv, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &widgets[TTx]{db: db, keys: keys, out: outbox.NewWriter(db.drv)}
}

func (a *widgets[TTx]) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /widgets", a.keys.Middleware(http.HandlerFunc(a.create)))
	return mux
}

func (a *widgets[TTx]) serve(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(a.handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

type widget struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

func (a *widgets[TTx]) create(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var in widget
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Name == "" {
		idempotency.Problem(w, r, http.StatusBadRequest, "want {\"name\": \"...\"}")
		return
	}
	if a.entered != nil {
		a.entered <- struct{}{}
		<-a.gate
	}
	fail := func(err error) {
		if errors.Is(err, idempotency.ErrClaimLost) {
			idempotency.Problem(w, r, http.StatusConflict, "taken over by a retry")
			return
		}
		idempotency.Problem(w, r, http.StatusInternalServerError, err.Error())
	}
	tx, err := a.db.drv.Begin(ctx)
	if err != nil {
		fail(err)
		return
	}
	defer func() { _ = a.db.drv.Rollback(context.WithoutCancel(ctx), tx) }()
	out := widget{ID: uuid.NewString(), Name: in.Name}
	if _, err := a.db.drv.Tx(tx).Exec(ctx, a.db.bind(`INSERT INTO widget (id, name) VALUES (?, ?)`), out.ID, out.Name); err != nil {
		fail(err)
		return
	}
	ev, err := idem.NewEvent("test.widget.created.v1", "widget", out.ID, out)
	if err != nil {
		fail(err)
		return
	}
	if err := a.out.Add(ctx, tx, ev); err != nil {
		fail(err)
		return
	}
	body, _ := json.Marshal(out)
	resp := idempotency.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
	if err := a.keys.Complete(ctx, tx, idempotency.ClaimFrom(ctx), resp); err != nil {
		fail(err)
		return
	}
	if a.failAfterComplete {
		fail(errors.New("failing on purpose, after the completion"))
		return
	}
	if a.beforeCommit != nil {
		a.beforeCommit()
	}
	if err := a.db.drv.Commit(ctx, tx); err != nil {
		fail(err)
		return
	}
	w.Header().Set("Set-Cookie", "session=s3cret") // never replayed
	resp.Send(w)
}

// answer is one response, read whole.
type answer struct {
	status     int
	replayed   bool
	retryAfter string
	header     http.Header
	body       string
	widget     widget
}

// post sends POST url+path with key (none when empty) and body.
func post(t testing.TB, url, key, body string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/widgets", bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idempotency.HeaderKey, key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("POST %s: %v", key, err)
		return answer{}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, replayed: resp.Header.Get(idempotency.HeaderReplayed) == "true",
		retryAfter: resp.Header.Get("Retry-After"), header: resp.Header, body: string(raw)}
	_ = json.Unmarshal(raw, &a.widget)
	return a
}

// waitEntered waits until the first request runs its handler, and fails
// if it was answered without running it.
func waitEntered(t testing.TB, entered <-chan struct{}, firstDone <-chan answer) {
	t.Helper()
	select {
	case <-entered:
	case a := <-firstDone:
		t.Fatalf("the first request answered %v without running its handler", a)
	case <-time.After(30 * time.Second):
		t.Fatal("the first request did not reach its handler within 30s")
	}
}

// lockWaits tells how far requests got in waiting for a key held by
// another transaction: on PostgreSQL, how many transactions hold a lock on
// idempotent_request (the holder's, and each retry's, whether it polls for
// the key's advisory lock in its transaction or waits for the row's lock);
// on MariaDB, how many transactions of the database wait for a lock (read
// at most every 100 ms: waitRetryWaits); on
// SQLite, whose pool has one connection, how many times a caller waited for
// it. Take it before a retry starts, then wait for it to grow
// (waitRetryWaits).
func (db testDB[TTx]) lockWaits(t testing.TB) int64 {
	t.Helper()
	var n int64
	switch db.dialect {
	case "sqlite":
		return any(db.drv).(interface{ DB() *sql.DB }).DB().Stats().WaitCount
	case "postgres":
		db.queryRow(t, `SELECT count(DISTINCT pid) FROM pg_locks WHERE relation = 'idempotent_request'::regclass`, &n)
	case "mysql":
		db.queryRow(t, `SELECT count(*) FROM information_schema.INNODB_TRX x
JOIN information_schema.PROCESSLIST p ON p.ID = x.trx_mysql_thread_id
WHERE x.trx_state = 'LOCK WAIT' AND p.DB = DATABASE()`, &n)
	default:
		t.Fatalf("lockWaits: no way to see a lock wait on %s", db.dialect)
	}
	return n
}

func (db testDB[TTx]) queryRow(t testing.TB, query string, dest ...any) {
	t.Helper()
	if err := driver.QueryRow(context.Background(), db.drv.Pool(), db.bind(query), nil, dest...); err != nil {
		t.Fatalf("query %q: %v", query, err)
	}
}

// waitRetryWaits waits until db.lockWaits grows past before: the retry
// started since waits for the key, held by another request's transaction.
// It fails if the retry answers first: it must wait.
func waitRetryWaits[TTx any](t testing.TB, db testDB[TTx], before int64, retryDone <-chan answer) {
	t.Helper()
	testsvc.WaitFor(t, 30*time.Second, "the retry waiting for the key", func() bool {
		select {
		case r := <-retryDone:
			t.Fatalf("retry answered %v while the first request holds the key; want it to wait", r)
		default:
		}
		if db.dialect == "mysql" {
			// MariaDB refreshes INNODB_TRX only when it was not read for
			// 100 ms: read it more often and it never shows the wait.
			time.Sleep(150 * time.Millisecond)
		}
		return db.lockWaits(t) > before
	})
}

func (a answer) String() string {
	return fmt.Sprintf("%d (replayed %v) %s", a.status, a.replayed, a.body)
}

// clock is a settable time for Config.Now.
type clock struct{ offset atomic.Int64 }

func (c *clock) now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *clock) advance(d time.Duration) { c.offset.Add(int64(d)) }
