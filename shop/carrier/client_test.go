package carrier_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/shop/carrier"
	"github.com/idem-go/idem/shop/internal/shoptest"
)

// fakeCarrier answers every request with the status of its path's
// method, and records the requests.
type fakeCarrier struct {
	mu       sync.Mutex
	status   map[string]int // "POST" or "GET" -> status
	requests []string       // "POST key" or "GET"
}

func (f *fakeCarrier) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.requests = append(f.requests, r.Method+" "+r.Header.Get("Idempotency-Key"))
	status := f.status[r.Method]
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	switch {
	case status >= 400:
		fmt.Fprintf(w, `{"status":%d,"detail":"nope"}`, status)
	case r.Method == http.MethodGet:
		fmt.Fprint(w, `[]`)
	default:
		fmt.Fprint(w, `{"id":"pk-1","reference":"r-1"}`)
	}
}

func (f *fakeCarrier) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requests...)
}

func serve(t *testing.T, h http.Handler) *carrier.Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &carrier.Client{BaseURL: srv.URL + "/carrier", HTTP: &http.Client{Timeout: 2 * time.Second}}
}

type verdict int

const (
	transient verdict = iota + 1
	permanent
)

func classify(err error) verdict {
	switch {
	case err == nil:
		return 0
	case idem.IsTransient(err) && !idem.IsPermanent(err):
		return transient
	case idem.IsPermanent(err) && !idem.IsTransient(err):
		return permanent
	}
	return -1
}

// TestClientStatusClassification checks how each answer of the carrier is
// reported: transient when a retry later can succeed, permanent when the
// carrier refused the request itself.
func TestClientStatusClassification(t *testing.T) {
	t.Parallel()
	for status, want := range map[int]verdict{
		500: transient, 502: transient, 503: transient, 504: transient,
		408: transient, 409: transient, 429: transient,
		400: permanent, 401: permanent, 403: permanent, 404: permanent, 422: permanent,
	} {
		f := &fakeCarrier{status: map[string]int{"POST": status, "GET": status}}
		c := serve(t, f)
		_, err := c.SendEmail(context.Background(), "invoice:1:email", "a@b.example", "s")
		if got := classify(err); got != want {
			t.Errorf("e-mail, %d: %v, classified %d, want %d", status, err, got, want)
		}
		_, err = c.RequestPickup(context.Background(), "r-1", "shipment:r-1:initial")
		if got := classify(err); got != want {
			t.Errorf("pickup, %d: %v, classified %d, want %d", status, err, got, want)
		}
		_, err = c.FindPickup(context.Background(), "r-1")
		if got := classify(err); got != want {
			t.Errorf("lookup, %d: %v, classified %d, want %d", status, err, got, want)
		}
		if want == permanent {
			// A refusal is final: no lookup, no second attempt.
			if seen := f.seen(); len(seen) != 3 || seen[1] != "POST shipment:r-1:initial" || seen[2] != "GET " {
				t.Errorf("%d: requests %q, want one e-mail, one pickup request and one lookup", status, seen)
			}
		}
	}
}

// TestClientConnectionFailures checks that a carrier that cannot be
// reached (closed port), closes the connection without answering, or
// answers too late is a transient failure, and that a caller's own
// cancellation is not.
func TestClientConnectionFailures(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := l.Addr().String()
	l.Close()
	hangUp := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			if tc, ok := conn.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // a reset, not a clean close
			}
			conn.Close()
		}
	})
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // so that the server sees the client leave
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	})
	cutShort := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":")
			_ = buf.Flush()
			conn.Close()
		}
	})
	cases := map[string]*carrier.Client{
		"closed port":      {BaseURL: "http://" + closedPort + "/carrier"},
		"reset":            serve(t, hangUp),
		"timeout":          serve(t, slow),
		"answer cut short": serve(t, cutShort),
	}
	cases["timeout"].HTTP.Timeout = 200 * time.Millisecond
	for name, c := range cases {
		_, err := c.RequestPickup(context.Background(), "r-1", "shipment:r-1:initial")
		if classify(err) != transient {
			t.Errorf("%s: pickup: %v, want a transient error", name, err)
		}
		_, err = c.SendEmail(context.Background(), "invoice:1:email", "a@b.example", "s")
		if classify(err) != transient {
			t.Errorf("%s: e-mail: %v, want a transient error", name, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = cases["closed port"].RequestPickup(ctx, "r-1", "k")
	if err == nil || idem.IsTransient(err) || idem.IsPermanent(err) || !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled by the caller: %v, want context.Canceled, neither transient nor permanent", err)
	}
}

// TestClientEmptyAnswer checks that a 200 with no body is an error that is
// neither transient nor permanent: the carrier misbehaves, and the
// consumer's retry policy decides.
func TestClientEmptyAnswer(t *testing.T) {
	t.Parallel()
	c := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	_, err := c.SendEmail(context.Background(), "invoice:1:email", "a@b.example", "s")
	if err == nil || idem.IsTransient(err) || idem.IsPermanent(err) {
		t.Fatalf("empty answer: %v, want a plain error", err)
	}
}

// TestRequestPickupAfterAFailure checks the lookup by reference, then the
// second attempt with the same key.
func TestRequestPickupAfterAFailure(t *testing.T) {
	t.Parallel()
	// 503 on the request, the lookup finds nothing: ask again, same key.
	f := &fakeCarrier{status: map[string]int{"POST": 503, "GET": 200}}
	_, err := serve(t, f).RequestPickup(context.Background(), "r-1", "shipment:r-1:initial")
	if classify(err) != transient {
		t.Fatalf("%v, want transient", err)
	}
	if seen := f.seen(); len(seen) != 3 || seen[0] != seen[2] || seen[1] != "GET " {
		t.Fatalf("requests %q, want POST, GET, POST with the same key", seen)
	}

	// The real carrier drops its answer: the pickup is found by reference.
	srv := shoptest.Carrier(t)
	c := srv.Client
	srv.DropResponses(1)
	p, err := c.RequestPickup(context.Background(), "r-2", "shipment:r-2:initial")
	if err != nil || p.ID == "" {
		t.Fatalf("after a dropped answer: %+v %v", p, err)
	}
	st, err := srv.Stats(context.Background())
	if err != nil || st.Pickups != 1 || st.Dropped != 1 || st.PickupRequests != 1 {
		t.Fatalf("carrier stats %+v (%v), want 1 request, dropped, and 1 pickup", st, err)
	}
}
