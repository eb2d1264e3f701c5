package webhookin_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/inbox/webhookin"
	"github.com/idem-go/idem/internal/testlog"
	"github.com/idem-go/idem/internal/testsvc"
)

// TestDuplicate: the sender delivers an event twice (a retry, signed
// anew): it is applied once, the second answer a 200 duplicate; the event
// id is idem.EventID of the sender's id, which the event's headers keep.
func TestDuplicate(t *testing.T) {
	eachDB(t, func(t *testing.T, e *env) {
		id, body := invoice(1)
		if a := e.post(t, signSW(id, time.Now().Add(-time.Minute), body, swSecret), body); a.status != http.StatusOK || a.outcome != "applied" {
			t.Fatalf("first delivery: %+v, want 200 applied", a)
		}
		if a := e.post(t, signedNow(id, body), body); a.status != http.StatusOK || a.outcome != "duplicate" {
			t.Fatalf("second delivery: %+v, want 200 duplicate", a)
		}
		want, _ := idem.EventID(id)
		if n := e.count(t, "payment WHERE event_id = '"+want.String()+"' AND original_id = '"+id+"'"); n != 1 {
			t.Errorf("%d payments of event %s (sender's %s), want 1", n, want, id)
		}
		if got := e.stored(t); got["payment"] != 1 || got["processed_event"] != 1 || got["failed_message"] != 0 {
			t.Errorf("stored %v", got)
		}
	})
}

// TestConcurrentDuplicate: two deliveries of one event at once: the second
// waits for the first's transaction (a lock wait on its marker; SQLite's one
// connection), then is a duplicate; neither is a 5xx, the event applied once.
func TestConcurrentDuplicate(t *testing.T) {
	eachDB(t, func(t *testing.T, e *env) {
		id, body := invoice(2)
		entered := make(chan int64, 2)
		release := make(chan struct{})
		free := sync.OnceFunc(func() { close(release) })
		defer free() // whatever happens, the handlers end, and the server can close
		e.setHook(func(ctx context.Context, tx *sql.Tx, _ idem.Event) error {
			s, err := e.session(ctx, tx)
			entered <- s
			<-release
			return err
		})
		answers := make(chan answer, 2)
		go func() { answers <- e.post(t, signedNow(id, body), body) }()
		first := <-entered
		waits := e.db.Stats().WaitCount
		retry := signSW(id, time.Now().Add(-2*time.Second), body, swSecret) // a retry, signed at another time
		go func() { answers <- e.post(t, retry, body) }()
		testsvc.WaitFor(t, 10*time.Second, "the second delivery to wait for the first's transaction", func() bool {
			return e.waiting(t, first, waits)
		})
		free()
		got := map[string]int{}
		for range 2 {
			a := <-answers
			if a.status != http.StatusOK {
				t.Errorf("answer %+v, want 200", a)
			}
			got[a.outcome]++
		}
		if got["applied"] != 1 || got["duplicate"] != 1 {
			t.Errorf("outcomes %v, want one applied and one duplicate", got)
		}
		if n := e.count(t, "payment"); n != 1 {
			t.Errorf("%d payments, want 1", n)
		}
	})
}

// TestRefused: a request the sender did not sign (a wrong secret, a
// tampered body, a timestamp beyond the tolerance, no signature), a body
// over the limit or another method is refused (401, 413, 405) and leaves
// nothing in the database; a good request after them (the barrier) is the
// only one stored.
func TestRefused(t *testing.T) {
	eachDB(t, func(t *testing.T, e *env) {
		id, body := invoice(3)
		other := "whsec_" + strings.Repeat("QUJD", 8)
		tampered := bytes.Replace(body, []byte("1999"), []byte("1"), 1)
		large := append(append([]byte(`{"type":"invoice.paid","pad":"`), bytes.Repeat([]byte("x"), idem.DefaultMaxBodyBytes)...), `"}`...)
		for _, c := range []struct {
			name   string
			header http.Header
			body   []byte
			status int
		}{
			{"another secret", signSW(id, time.Now(), body, other), body, http.StatusUnauthorized},
			{"tampered body", signedNow(id, body), tampered, http.StatusUnauthorized},
			{"6 minutes old", signSW(id, time.Now().Add(-6*time.Minute), body, swSecretNext), body, http.StatusUnauthorized},
			{"unsigned", http.Header{"Webhook-Id": {id}}, body, http.StatusUnauthorized},
			{"too large", signedNow(id, large), large, http.StatusRequestEntityTooLarge},
		} {
			if a := e.post(t, c.header, c.body); a.status != c.status || a.err == "" {
				t.Errorf("%s: %+v, want %d with a reason", c.name, a, c.status)
			}
		}
		resp, err := http.Get(e.url)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != http.MethodPost {
			t.Errorf("GET: %d, Allow %q", resp.StatusCode, resp.Header.Get("Allow"))
		}
		if a := e.post(t, signedNow(id, body), body); a.status != http.StatusOK || a.outcome != "applied" {
			t.Fatalf("the barrier: %+v", a)
		}
		if got := e.stored(t); got["payment"] != 1 || got["processed_event"] != 1 || got["failed_message"] != 0 || got["delivery_attempt"] != 0 {
			t.Errorf("stored %v, want the barrier's payment and marker only", got)
		}
	})
}

// TestTransient: a handler that reports a dependency away (idem.Transient)
// gets 503 with Retry-After and leaves no marker, no attempt, nothing
// parked; the sender's retry, once the dependency is back, applies it.
func TestTransient(t *testing.T) {
	eachDB(t, func(t *testing.T, e *env) {
		id, body := invoice(4)
		e.setHook(func(context.Context, *sql.Tx, idem.Event) error {
			return idem.Transient(errors.New("the ledger is away"))
		})
		for range 2 {
			a := e.post(t, signedNow(id, body), body)
			if s, err := strconv.Atoi(a.retryAfter); a.status != http.StatusServiceUnavailable || err != nil || s < 1 {
				t.Fatalf("transient failure: %+v, want 503 with Retry-After", a)
			}
		}
		if got := e.stored(t); got["payment"] != 0 || got["processed_event"] != 0 || got["failed_message"] != 0 || got["delivery_attempt"] != 0 {
			t.Errorf("stored %v, want nothing", got)
		}
		e.setHook(nil)
		e.clock.Advance(time.Minute) // the consumer's pause has ended
		if a := e.post(t, signedNow(id, body), body); a.status != http.StatusOK || a.outcome != "applied" {
			t.Fatalf("the retry: %+v, want 200 applied", a)
		}
	})
}

// TestPermanent: a handler error wrapped with idem.Permanent parks the
// request at once, byte for byte with its headers, and answers 202 (the
// sender stops); no marker, no effect. Re-driven through the handler
// (inbox.FailureStore.Retry, as the dashboard does) once the handler is
// fixed, it is applied and its entry removed.
func TestPermanent(t *testing.T) {
	eachDB(t, func(t *testing.T, e *env) {
		id, body := invoice(5)
		e.setHook(func(context.Context, *sql.Tx, idem.Event) error {
			return idem.Permanent(errors.New("unknown currency"))
		})
		header := signedNow(id, body)
		header.Set("Authorization", "Bearer S3cret")
		if a := e.post(t, header, body); a.status != http.StatusAccepted || a.outcome != "parked" {
			t.Fatalf("permanent failure: %+v, want 202 parked", a)
		}
		if got := e.stored(t); got["payment"] != 0 || got["processed_event"] != 0 || got["failed_message"] != 1 {
			t.Errorf("stored %v", got)
		}
		m := parked(t, e.c)
		want, _ := idem.EventID(id)
		if !bytes.Equal(m.Body, body) || m.EventID != want || m.EventName != "invoice.paid" || m.Source != "webhook:payments" ||
			m.Headers["webhook-id"] != id || m.Headers["webhook-signature"] != header.Get("Webhook-Signature") || !strings.Contains(m.Error, "unknown currency") {
			t.Errorf("parked %+v", m)
		}
		if _, ok := m.Headers["authorization"]; ok {
			t.Errorf("the Authorization header was kept: %v", m.Headers)
		}

		e.setHook(nil)
		sent, failed, err := e.c.Failures().Retry(context.Background(), e.h, m, nil)
		if err != nil || sent != 1 || failed != 0 {
			t.Fatalf("Retry = %d sent, %d failed, %v", sent, failed, err)
		}
		if got := e.stored(t); got["payment"] != 1 || got["processed_event"] != 1 || got["failed_message"] != 0 {
			t.Errorf("after the re-drive: stored %v, want applied and the entry removed", got)
		}
		if a := e.post(t, signedNow(id, body), body); a.status != http.StatusOK || a.outcome != "duplicate" {
			t.Errorf("the sender again after the re-drive: %+v, want 200 duplicate", a)
		}
	})
}

// TestRetried: a handler error that is neither permanent nor transient
// counts an attempt (500 with Retry-After: the sender retries) until the
// retry policy's last, then parks (202).
func TestRetried(t *testing.T) {
	eachDB(t, func(t *testing.T, e *env) {
		id, body := invoice(6)
		e.setHook(func(context.Context, *sql.Tx, idem.Event) error { return errors.New("constraint violated") })
		if a := e.post(t, signedNow(id, body), body); a.status != http.StatusInternalServerError || a.retryAfter == "" {
			t.Fatalf("first attempt: %+v, want 500 with Retry-After", a)
		}
		if got := e.stored(t); got["delivery_attempt"] != 1 || got["processed_event"] != 0 || got["failed_message"] != 0 {
			t.Errorf("after the first attempt: stored %v", got)
		}
		if a := e.post(t, signedNow(id, body), body); a.status != http.StatusAccepted || a.outcome != "parked" {
			t.Fatalf("last attempt: %+v, want 202 parked", a)
		}
		if m := parked(t, e.c); m.Attempts != 2 {
			t.Errorf("parked after %d attempts, want 2", m.Attempts)
		}
	}, func(c *inbox.Config) { c.Retry = inbox.RetryPolicy{MaxRetries: 1} })
}

// TestUndecodable: a signed request whose event cannot be read is parked
// with its raw bytes and answered 202, whether the provider cannot find its
// id or type (a body that is not JSON, no type) or the consumer cannot
// decode it (GitHub's id and type are headers; its body is not JSON).
// Re-driven, an entry still unreadable stays one entry.
func TestUndecodable(t *testing.T) {
	eachDB(t, func(t *testing.T, e *env) {
		for i, body := range [][]byte{[]byte("\xff\x00 not json"), []byte(`{"data":{"invoice":"in_7"}}`)} {
			id := "msg_undecodable_" + strconv.Itoa(i)
			if a := e.post(t, signedNow(id, body), body); a.status != http.StatusAccepted || a.outcome != "parked" {
				t.Fatalf("%q: %+v, want 202 parked", body, a)
			}
		}
		gh, err := inbox.New(e.drv, inbox.Config{Name: "github", Logger: testlog.New(t)})
		if err != nil {
			t.Fatal(err)
		}
		gh.Handle("issues", func(context.Context, *sql.Tx, idem.Event) error { return nil })
		ghh, err := webhookin.New(gh, webhookin.Config{Provider: webhookin.GitHub{Secrets: []string{githubSecret}}, Logger: testlog.New(t)})
		if err != nil {
			t.Fatal(err)
		}
		ghBody := []byte("payload=%7B%22action%22%3A%22opened%22%7D") // a form, not JSON
		req := signGitHub(t, ghBody, "72d3162e-cc78-11e3-81ab-4c9367dc0958", "issues")
		if a := serve(ghh, req); a != http.StatusAccepted {
			t.Fatalf("GitHub form body: %d, want 202", a)
		}

		all, err := e.c.Failures().List(context.Background(), idem.FailedFilter{Oldest: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(all) != 3 {
			t.Fatalf("%d parked, want 3", len(all))
		}
		for _, m := range all {
			if !strings.Contains(m.Error, "undecodable") {
				t.Errorf("entry %d: error %q, want undecodable", m.ID, m.Error)
			}
		}
		if !bytes.Equal(all[0].Body, []byte("\xff\x00 not json")) || all[0].Source != "webhook:payments" || all[0].Headers["webhook-id"] != "msg_undecodable_0" {
			t.Errorf("first entry %+v, want the raw body and headers", all[0])
		}
		if all[2].Consumer != "github" || !bytes.Equal(all[2].Body, ghBody) || all[2].EventID.String() != "72d3162e-cc78-11e3-81ab-4c9367dc0958" || all[2].Source != "webhook:github" {
			t.Errorf("GitHub's entry %+v", all[2])
		}

		sent, _, err := e.c.Failures().Retry(context.Background(), e.h, all[0], nil)
		if err != nil || sent != 1 {
			t.Fatalf("re-drive: %d sent, %v", sent, err)
		}
		again, err := e.c.Failures().Get(context.Background(), all[0].ID)
		if err != nil || again.Attempts != 2 || !bytes.Equal(again.Body, all[0].Body) {
			t.Errorf("after the re-drive: %+v, %v; want the same entry, 2 attempts", again, err)
		}
		if n := e.count(t, "failed_message"); n != 3 {
			t.Errorf("%d entries after the re-drive, want 3", n)
		}
		if err := ghh.Redeliver(context.Background(), "webhook:payments", []idem.Message{{Body: []byte("{}")}}); err == nil || !strings.Contains(err.Error(), "not this handler's") {
			t.Errorf("GitHub's handler re-driving the payments' message: %v", err)
		}
		if err := (webhookin.Handlers{ghh, e.h}).Redeliver(context.Background(), "webhook:nowhere", nil); err == nil {
			t.Error("Handlers.Redeliver to an unknown source: nil")
		}
	})
}

// parked returns the consumer's one parked message.
func parked(t *testing.T, c *inbox.Consumer[*sql.Tx]) idem.FailedMessage {
	t.Helper()
	ms, err := c.Failures().List(context.Background(), idem.FailedFilter{})
	if err != nil || len(ms) != 1 {
		t.Fatalf("failure store: %d messages, %v; want 1", len(ms), err)
	}
	return ms[0]
}
