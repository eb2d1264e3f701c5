package webhook_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/webhook"
)

// endpoint is an HTTP receiver of the webhook's requests for the
// conformance suite: it keeps what it accepts, refuses what it is told to
// (a result with an error) and answers 503 while away.
type endpoint struct {
	mu       sync.Mutex
	accepted []idem.Message
	refuse   func(idem.Message) bool
	away     bool
}

func (e *endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req webhook.Request
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.away {
		http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
		return
	}
	results := make([]*webhook.Result, len(req.Messages))
	for i, m := range req.Messages {
		msg := idem.Message{EventID: m.EventID, EventName: m.EventName, AggregateType: m.AggregateType,
			Key: m.Key, Headers: m.Headers, Body: m.Body}
		if e.refuse != nil && e.refuse(msg) {
			results[i] = &webhook.Result{Error: "refused: no route for " + m.EventName}
			continue
		}
		e.accepted = append(e.accepted, msg)
	}
	_ = json.NewEncoder(w).Encode(webhook.Response{Results: results})
}

// The webhook publisher has no subscriber: it passes the publisher part of
// the conformance suite against an in-process endpoint.
func TestConformance(t *testing.T) {
	brokertest.RunPublisher(t, brokertest.PublisherTransport{
		New: func(t *testing.T) brokertest.PublisherInstance {
			e := &endpoint{}
			srv := httptest.NewServer(e)
			t.Cleanup(srv.Close)
			pub := webhook.New(srv.URL, nil)
			t.Cleanup(func() { _ = pub.Close() })
			return brokertest.PublisherInstance{
				Publisher: pub,
				Accepted: func(*testing.T) []idem.Message {
					e.mu.Lock()
					defer e.mu.Unlock()
					return append([]idem.Message(nil), e.accepted...)
				},
				Refuse: func(_ *testing.T, refuse func(idem.Message) bool) {
					e.mu.Lock()
					defer e.mu.Unlock()
					e.refuse = refuse
				},
				Away: func(_ *testing.T, away bool) {
					e.mu.Lock()
					defer e.mu.Unlock()
					e.away = away
				},
			}
		},
	})
}
