package webhook_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/webhook"
)

// FuzzResponse answers the publisher's requests with any status and body:
// it must not panic, and its error must say what the relay needs. A 2xx
// answer accepts the call (nil), refuses some messages (a *BatchError with
// one entry per message) or fails the call as a whole (a results list of
// the wrong length); a status that refuses the content refuses every
// message, each marked broker.Refused; any other status fails the whole
// call, unmarked, for the relay to retry.
func FuzzResponse(f *testing.F) {
	f.Add(uint16(0), []byte(``), uint8(1))
	f.Add(uint16(0), []byte(`{"results":[null,{"error":"full"}]}`), uint8(2))
	f.Add(uint16(0), []byte(`{"results":[{}]}`), uint8(3))
	f.Add(uint16(0), []byte(`{"results":[{"error":""},{"error":"x"}]}`), uint8(2))
	f.Add(uint16(0), []byte(`{"results":null}`), uint8(1))
	f.Add(uint16(0), []byte(`{"results":{}}`), uint8(1))
	f.Add(uint16(0), []byte("\xff\x00"), uint8(4))
	f.Add(uint16(4), []byte(`{"results":[]}`), uint8(1))
	f.Add(uint16(200), []byte(`bad request`), uint8(3))
	f.Add(uint16(213), []byte(`too large`), uint8(5))
	f.Add(uint16(300), []byte(`down`), uint8(2))
	f.Add(uint16(322), []byte(`{"results":[{"error":"x"}]}`), uint8(1))
	var mu sync.Mutex
	var status int
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		s, b := status, body
		mu.Unlock()
		w.WriteHeader(s)
		_, _ = w.Write(b)
	}))
	f.Cleanup(srv.Close)
	pub := webhook.New(srv.URL, nil)
	f.Cleanup(func() { _ = pub.Close() })
	f.Fuzz(func(t *testing.T, code uint16, reply []byte, n uint8) {
		s := 200 + int(code)%400 // 200-599
		count := 1 + int(n)%4
		mu.Lock()
		status, body = s, reply
		mu.Unlock()
		msgs := messages(t, count)
		err := pub.Publish(context.Background(), msgs)
		var be *broker.BatchError
		isBatch := errors.As(err, &be)
		if isBatch && len(be.Errs) != count {
			t.Fatalf("status %d, body %q: BatchError with %d entries for %d messages", s, reply, len(be.Errs), count)
		}
		switch {
		case s == http.StatusBadRequest || s == http.StatusRequestEntityTooLarge ||
			s == http.StatusUnsupportedMediaType || s == http.StatusUnprocessableEntity:
			for i, e := range broker.Results(err, count) {
				if !broker.IsRefused(e) || broker.IsFault(e) {
					t.Fatalf("status %d: message %d: %v, want a refusal", s, i, e)
				}
			}
		case s < 300:
			if broker.IsRefused(err) {
				t.Fatalf("status %d, body %q: %v marked refused", s, reply, err)
			}
			if isBatch {
				for i, e := range be.Errs {
					if e != nil && (e.Error() == "" || broker.IsFault(e)) {
						t.Fatalf("status %d, body %q: message %d: %q, want a refusal with a reason", s, reply, i, e)
					}
				}
			}
		default:
			if err == nil || isBatch || broker.IsRefused(err) {
				t.Fatalf("status %d: %v, want the whole call failed, unmarked", s, err)
			}
		}
	})
}
