package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/outbox"
)

// TestReplayProgress: idem replay, its output no terminal, logs how far it
// is (one line per page with the shortest interval) and a summary with the
// total it counted first.
func TestReplayProgress(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	ctx := context.Background()
	const n = 50
	w := outbox.NewWriter(pg.Driver)
	for i := range n {
		ev, err := idemmsg.NewEvent("order.order.placed.v1", "order", fmt.Sprint(i%5), map[string]int{"n": i})
		if err != nil {
			t.Fatal(err)
		}
		if err := pgx.BeginFunc(ctx, pg.Pool, func(tx pgx.Tx) error { return w.Add(ctx, tx, ev) }); err != nil {
			t.Fatal(err)
		}
	}
	pg.Exec(t, `UPDATE outbox SET published_at = now()`)
	h := newHook(t)
	env := map[string]string{"IDEM_DB_URL": pg.URL, "IDEM_BROKER_URL": h.url(), progressIntervalEnv: "1ns"}
	code, out, errOut := idem(t, env, "", "replay", "--since", "1h", "--yes", "--batch-size", "10")
	if code != 0 || !strings.Contains(out, fmt.Sprintf("Replayed %d events.", n)) {
		t.Fatalf("replay = %d\n%s%s", code, out, errOut)
	}
	if got := len(h.ids()); got != n {
		t.Fatalf("replay published %d events, want %d", got, n)
	}
	if !strings.Contains(errOut, `msg="replay progress" events=10 total=50 percent=20 `) ||
		!strings.Contains(errOut, `msg="replay done" events=50 total=50 percent=100 `) {
		t.Errorf("replay logged no progress line or no summary:\n%s", errOut)
	}
	// Without the variable, the interval is 10s: the summary only.
	delete(env, progressIntervalEnv)
	code, _, errOut = idem(t, env, "", "replay", "--since", "1h", "--yes")
	if code != 0 || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, `msg="replay done" events=50`) {
		t.Errorf("replay with the default interval = %d, want the summary alone:\n%s", code, errOut)
	}
	env[progressIntervalEnv] = "soon"
	if code, _, errOut := idem(t, env, "", "replay", "--since", "1h", "--yes"); code != 1 || !strings.Contains(errOut, progressIntervalEnv+`="soon"`) {
		t.Errorf("replay with a bad interval = %d %q", code, errOut)
	}
}

// TestPurgeProgress: idem purge logs how far it is (with the shortest
// interval, one line per statement) and a summary of each purge, with
// no total (a purge deletes until a batch comes back short).
func TestPurgeProgress(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	pg.Exec(t, `INSERT INTO processed_event (consumer_name, event_id, processed_at)
SELECT 'stock', gen_random_uuid(), now() - interval '40 days' FROM generate_series(1, 25)`)
	pg.Exec(t, `INSERT INTO failed_message (consumer_name, source, body, error, attempts, first_failed_at, failed_at)
SELECT 'stock', 'stock.events', 'x', 'boom', 1, now() - interval '40 days', now() - interval '40 days' FROM generate_series(1, 3)`)
	env := map[string]string{"IDEM_DB_URL": pg.URL, progressIntervalEnv: "1ns"}
	code, out, errOut := idem(t, env, "", "purge", "--older-than", "31d", "--failed-older-than", "31d", "--replay-window", "30d", "--batch-size", "10")
	if code != 0 || !strings.Contains(out, "Deleted 25 marker(s)") || !strings.Contains(out, "Deleted 3 parked message(s)") {
		t.Fatalf("purge = %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{`msg="purge progress" rows=10 per_second=`, `msg="purge progress" rows=20 `,
		`msg="purge done" rows=25 per_second=`, "markers=25 attempt_counts=0", `msg="purge done" parked_messages=3 `} {
		if !strings.Contains(errOut, want) {
			t.Errorf("purge did not log %q:\n%s", want, errOut)
		}
	}
	if strings.Contains(errOut, "total=") {
		t.Errorf("purge logged a total it cannot know:\n%s", errOut)
	}
}

// TestCDCInitialRowsProgress: idem cdc, on PostgreSQL and on MariaDB,
// publishes the rows that waited in the outbox before its first start
// before it reads the log, logging how far it is (with the shortest
// interval, at least one line before the end) and a summary with their
// total.
func TestCDCInitialRowsProgress(t *testing.T) {
	t.Parallel()
	const n = 120
	events := func(t *testing.T) []idemmsg.Event {
		var evs []idemmsg.Event
		for i := range n {
			ev, err := idemmsg.NewEvent("order.order.placed.v1", "order", fmt.Sprint(i%7), map[string]int{"n": i})
			if err != nil {
				t.Fatal(err)
			}
			evs = append(evs, ev)
		}
		return evs
	}
	for _, tc := range []struct {
		name, running, done string
		setup               func(t *testing.T) (dbURL string, args []string)
	}{
		{"postgres", "publishing the rows that were waiting in the outbox when the slot was created",
			"published the rows that were waiting in the outbox when the slot was created",
			func(t *testing.T) (string, []string) {
				pg := testdb.NewPostgres(t)
				dropSlotAtCleanup(t, pg)
				ctx := context.Background()
				w := outbox.NewWriter(pg.Driver)
				if err := pgx.BeginFunc(ctx, pg.Pool, func(tx pgx.Tx) error { return w.Add(ctx, tx, events(t)...) }); err != nil {
					t.Fatal(err)
				}
				return pg.URL, []string{"--schema", pg.Schema, "--slot", cdcSlot(pg), "--prefix", cdcPrefix(pg)}
			}},
		{"mariadb", "publishing the rows that were waiting in the outbox at the first start",
			"published the rows that were waiting in the outbox at the first start",
			func(t *testing.T) (string, []string) {
				db := testdb.NewMariaDB(t)
				ctx := context.Background()
				w := outbox.NewWriter(db.Driver)
				if err := inTx(ctx, db.DB, func(tx *sql.Tx) error { return w.Add(ctx, tx, events(t)...) }); err != nil {
					t.Fatal(err)
				}
				return db.URL, nil
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dbURL, args := tc.setup(t)
			h := newHook(t)
			log := &syncWriter{w: &strings.Builder{}}
			ctx, stop := context.WithCancel(context.Background())
			done := make(chan int, 1)
			go func() {
				environ := map[string]string{progressIntervalEnv: "1ns"}
				e := &env{stdout: io.Discard, stderr: log, stdin: strings.NewReader(""), getenv: func(k string) string { return environ[k] }}
				done <- run(ctx, e, append([]string{"cdc", "--db", dbURL, "--broker", h.url(), "--metrics-addr", ""}, args...))
			}()
			exited := false
			t.Cleanup(func() {
				stop()
				if !exited {
					<-done
				}
				if t.Failed() {
					t.Logf("idem cdc's log:\n%s", tail(log.String(), 6000))
				}
			})
			summary := fmt.Sprintf(` rows=%d total=%[1]d percent=100 `, n)
			testsvc.WaitFor(t, 60*time.Second, "the summary of the waiting rows", func() bool {
				return logLine(log.String(), `msg="`+tc.done+`"`, summary) != ""
			})
			stop()
			exited = true
			if code := <-done; code != 0 {
				t.Fatalf("idem cdc exited with %d", code)
			}
			if got := len(h.ids()); got != n {
				t.Errorf("published %d events, want %d", got, n)
			}
			out := log.String()
			if logLine(out, `msg="`+tc.running+`"`, fmt.Sprintf(" total=%d ", n)) == "" ||
				logLine(out, `msg="`+tc.done+`"`, fmt.Sprintf(" published=%d quarantined=0", n)) == "" {
				t.Errorf("no progress line, or a summary without its counts")
			}
		})
	}
}

// logLine returns the first line of log holding every one of parts, ""
// when none does.
func logLine(log string, parts ...string) string {
	for _, line := range strings.Split(log, "\n") {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			return line
		}
	}
	return ""
}
