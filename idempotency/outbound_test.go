package idempotency_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempotency"
)

// remote is a real HTTP service that does its work once per key, and can
// be told to fail before the work or to lose its answers after it.
type remote struct {
	mu        sync.Mutex
	byKey     map[string]pickup
	requests  []string // "POST <key>", "GET <reference>"
	dropAfter int      // the next n POSTs do the work, then close the connection unanswered
	failFirst int      // the next n POSTs answer 503 without doing the work
	refuse    bool     // POSTs answer 422
	lookupErr bool     // GETs answer 500
}

type pickup struct {
	ID        string `json:"id"`
	Reference string `json:"reference"`
}

func (s *remote) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.Method == http.MethodGet {
		ref := r.URL.Query().Get("reference")
		s.requests = append(s.requests, "GET "+ref)
		if s.lookupErr {
			http.Error(w, "lookup broken", http.StatusInternalServerError)
			return
		}
		found := []pickup{}
		for _, p := range s.byKey {
			if p.Reference == ref {
				found = append(found, p)
			}
		}
		_ = json.NewEncoder(w).Encode(found)
		return
	}
	key := r.Header.Get(idempotency.HeaderKey)
	s.requests = append(s.requests, "POST "+key)
	var in struct{ Reference string }
	_ = json.NewDecoder(r.Body).Decode(&in)
	switch {
	case s.refuse:
		http.Error(w, "no such address", http.StatusUnprocessableEntity)
		return
	case s.failFirst > 0:
		s.failFirst--
		http.Error(w, "busy", http.StatusServiceUnavailable)
		return
	}
	p, replay := s.byKey[key]
	if !replay {
		p = pickup{ID: "pk-" + uuid.NewString()[:8], Reference: in.Reference}
		s.byKey[key] = p
	}
	if s.dropAfter > 0 {
		s.dropAfter--
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close() // the work is done; the answer is lost
		}
		return
	}
	if replay {
		w.Header().Set(idempotency.HeaderReplayed, "true")
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusCreated)
	}
	_ = json.NewEncoder(w).Encode(p)
}

func (s *remote) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.requests...)
}

func (s *remote) pickups() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byKey)
}

// remoteClient calls a remote, classifying its failures.
type remoteClient struct {
	base string
	http *http.Client
}

func newRemote(t *testing.T) (*remote, *remoteClient) {
	t.Helper()
	s := &remote{byKey: map[string]pickup{}}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	// A fresh connection per request: net/http's Transport resends a
	// request with an Idempotency-Key by itself when a reused connection
	// drops, which would hide what Do does.
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return s, &remoteClient{base: srv.URL, http: &http.Client{Transport: tr, Timeout: 5 * time.Second}}
}

func (c *remoteClient) do(req *http.Request, out any) error {
	resp, err := c.http.Do(req)
	if err != nil {
		return idempotency.ClassifyTransport(req.Context(), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return idempotency.ClassifyStatus(resp.StatusCode, fmt.Errorf("%s %s: %s: %s", req.Method, req.URL.Path, resp.Status, bytes.TrimSpace(msg)))
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return idempotency.ClassifyTransport(req.Context(), err)
	}
	return nil
}

func (c *remoteClient) request(ctx context.Context, ref, key string) (pickup, error) {
	body, _ := json.Marshal(map[string]string{"reference": ref})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/pickups", bytes.NewReader(body))
	if err != nil {
		return pickup{}, err
	}
	req.Header.Set(idempotency.HeaderKey, key)
	var p pickup
	return p, c.do(req, &p)
}

func (c *remoteClient) find(ctx context.Context, ref string) (pickup, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/pickups?reference="+url.QueryEscape(ref), nil)
	if err != nil {
		return pickup{}, false, err
	}
	var list []pickup
	if err := c.do(req, &list); err != nil {
		return pickup{}, false, err
	}
	if len(list) == 0 {
		return pickup{}, false, nil
	}
	return list[0], true, nil
}

func (c *remoteClient) call(ref string, lookup bool) idempotency.Call[pickup] {
	call := idempotency.Call[pickup]{
		Key:  idempotency.StableKey("shipment", ref, "initial"),
		Send: func(ctx context.Context, key string) (pickup, error) { return c.request(ctx, ref, key) },
	}
	if lookup {
		call.Lookup = func(ctx context.Context) (pickup, bool, error) { return c.find(ctx, ref) }
	}
	return call
}

func classify(err error) string {
	switch {
	case err == nil:
		return "ok"
	case idem.IsTransient(err) && !idem.IsPermanent(err):
		return "transient"
	case idem.IsPermanent(err) && !idem.IsTransient(err):
		return "permanent"
	case idem.IsTransient(err):
		return "both"
	}
	return "plain"
}

func TestDo(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		set     func(*remote)
		lookup  bool
		want    string   // classification of Do's error
		seen    []string // requests, with k the key and r the reference
		pickups int
	}{
		{"answered", func(*remote) {}, true, "ok", []string{"POST k"}, 1},
		{"answer lost, found by lookup", func(s *remote) { s.dropAfter = 1 }, true, "ok", []string{"POST k", "GET r"}, 1},
		{"answer lost, sent again with the key", func(s *remote) { s.dropAfter = 1 }, false, "ok", []string{"POST k", "POST k"}, 1},
		{"failed before the work, not found, sent again", func(s *remote) { s.failFirst = 1 }, true, "ok", []string{"POST k", "GET r", "POST k"}, 1},
		{"refused: no lookup, no retry", func(s *remote) { s.refuse = true }, true, "permanent", []string{"POST k"}, 0},
		{"every answer lost", func(s *remote) { s.dropAfter = 5 }, false, "transient", []string{"POST k", "POST k"}, 1},
		{"away", func(s *remote) { s.failFirst = 5 }, true, "transient", []string{"POST k", "GET r", "POST k"}, 0},
		{"answer lost, lookup broken", func(s *remote) { s.dropAfter = 1; s.lookupErr = true }, true, "transient", []string{"POST k", "GET r"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, c := newRemote(t)
			tc.set(s)
			ref := uuid.NewString()
			call := c.call(ref, tc.lookup)
			p, err := idempotency.Do(context.Background(), call)
			if got := classify(err); got != tc.want {
				t.Fatalf("Do: %v, classified %s, want %s", err, got, tc.want)
			}
			if err == nil && (p.Reference != ref || p.ID == "") {
				t.Errorf("Do returned %+v, want the pickup of %s", p, ref)
			}
			want := make([]string, len(tc.seen))
			for i, r := range tc.seen {
				want[i] = strings.NewReplacer(" k", " "+call.Key, " r", " "+ref).Replace(r)
			}
			if got := s.seen(); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("requests %q, want %q", got, want)
			}
			if n := s.pickups(); n != tc.pickups {
				t.Errorf("%d pickups at the remote, want %d", n, tc.pickups)
			}
			if tc.name == "answer lost, lookup broken" && !strings.Contains(err.Error(), "lookup failed") {
				t.Errorf("error %q does not say the lookup failed", err)
			}
		})
	}
}

func TestDoCallerGivesUp(t *testing.T) {
	t.Parallel()
	s, c := newRemote(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := idempotency.Do(ctx, c.call("r-1", true))
	if !errors.Is(err, context.Canceled) || classify(err) != "plain" {
		t.Fatalf("cancelled by the caller: %v (%s), want context.Canceled, neither transient nor permanent", err, classify(err))
	}
	if seen := s.seen(); len(seen) != 0 {
		t.Fatalf("requests %q after the caller gave up", seen)
	}
	if _, err := idempotency.Do(context.Background(), idempotency.Call[int]{Key: " bad", Send: func(context.Context, string) (int, error) { return 0, nil }}); classify(err) != "permanent" {
		t.Fatalf("an invalid key: %v, want a permanent error", err)
	}
	if _, err := idempotency.Do(context.Background(), idempotency.Call[int]{Key: "k"}); classify(err) != "permanent" {
		t.Fatalf("no Send: %v, want a permanent error", err)
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	base := errors.New("x")
	for code, want := range map[int]string{
		500: "transient", 502: "transient", 503: "transient", 504: "transient",
		408: "transient", 409: "transient", 425: "transient", 429: "transient",
		400: "permanent", 401: "permanent", 403: "permanent", 404: "permanent", 422: "permanent",
		302: "plain",
	} {
		if got := classify(idempotency.ClassifyStatus(code, base)); got != want {
			t.Errorf("status %d: %s, want %s", code, got, want)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	_, err = http.Get("http://" + closed + "/")
	if got := classify(idempotency.ClassifyTransport(context.Background(), err)); got != "transient" {
		t.Errorf("connection refused: %s, want transient", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if got := classify(idempotency.ClassifyTransport(ctx, err)); got != "plain" {
		t.Errorf("after the caller gave up: %s, want plain", got)
	}
	if got := classify(idempotency.ClassifyTransport(context.Background(), io.ErrUnexpectedEOF)); got != "transient" {
		t.Errorf("answer cut short: %s, want transient", got)
	}
	if got := classify(idempotency.ClassifyTransport(context.Background(), base)); got != "plain" {
		t.Errorf("any other error: %s, want plain", got)
	}
}
