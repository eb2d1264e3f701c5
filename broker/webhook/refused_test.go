package webhook_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/webhook"
)

// TestRefusedContent: an endpoint that refuses a request's content (400,
// 413, 415, 422) gets the messages again in halves, and only the messages
// it refuses alone are refused, each marked broker.Refused; other statuses
// fail the whole call, unmarked.
func TestRefusedContent(t *testing.T) {
	for _, status := range []int{http.StatusBadRequest, http.StatusRequestEntityTooLarge,
		http.StatusUnsupportedMediaType, http.StatusUnprocessableEntity} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			msgs := messages(t, 5)
			bad := msgs[3].EventID
			var requests atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				requests.Add(1)
				var req webhook.Request
				if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
					t.Error(err)
				}
				for _, m := range req.Messages {
					if m.EventID == bad {
						w.WriteHeader(status)
						return
					}
				}
			}))
			defer srv.Close()
			pub := webhook.New(srv.URL, nil)
			defer pub.Close()
			err := pub.Publish(context.Background(), msgs)
			var be *broker.BatchError
			if !errors.As(err, &be) || len(be.Errs) != len(msgs) {
				t.Fatalf("Publish = %v, want a *broker.BatchError", err)
			}
			for i, e := range be.Errs {
				switch {
				case msgs[i].EventID == bad && (!broker.IsRefused(e) || broker.IsFault(e)):
					t.Errorf("message %d: %v, want a refusal", i, e)
				case msgs[i].EventID != bad && e != nil:
					t.Errorf("message %d: %v, want accepted", i, e)
				}
			}
			if n := requests.Load(); n > 7 {
				t.Errorf("%d requests to find one refused message among 5", n)
			}
		})
	}
	t.Run("one message", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusRequestEntityTooLarge)
		}))
		defer srv.Close()
		pub := webhook.New(srv.URL, nil)
		defer pub.Close()
		if err := pub.Publish(context.Background(), messages(t, 1)); !broker.IsRefused(err) {
			t.Fatalf("Publish = %v, want a refusal", err)
		}
	})
	for _, status := range []int{http.StatusUnauthorized, http.StatusNotFound, http.StatusTooManyRequests, http.StatusBadGateway} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(status)
			}))
			defer srv.Close()
			pub := webhook.New(srv.URL, nil)
			defer pub.Close()
			err := pub.Publish(context.Background(), messages(t, 3))
			var be *broker.BatchError
			if err == nil || broker.IsRefused(err) || errors.As(err, &be) {
				t.Fatalf("Publish = %v, want a whole-call failure", err)
			}
		})
	}
}
