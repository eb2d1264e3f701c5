package webhook_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/webhook"
)

// endpoint is an HTTP receiver of the webhook's requests for the
// conformance suite: it keeps what it accepts, refuses what it is told to
// (a result with an error; 422 for a message of its own) and answers 503
// while away. With keys, it accepts only requests signed with one of them
// (verify, the Standard Webhooks scheme written from the spec).
type endpoint struct {
	mu       sync.Mutex
	accepted []idem.Message
	refuse   func(idem.Message) bool
	away     bool
	// keys verify the requests' signatures, when set; perMessage says that
	// each request is one message (webhook.PerMessage).
	keys       [][]byte
	perMessage bool
}

func (e *endpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if e.keys != nil {
		if err := verify(r.Header, body, e.keys, time.Now(), 5*time.Minute); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
	}
	if e.perMessage {
		e.serveMessage(w, r, body)
		return
	}
	var req webhook.Request
	if err := json.Unmarshal(body, &req); err != nil {
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

// serveMessage receives one message of the mode PerMessage: its event id
// in webhook-id, its body as it is, its headers as HTTP headers; its name,
// aggregate type and key are the envelope's.
func (e *endpoint) serveMessage(w http.ResponseWriter, r *http.Request, body []byte) {
	id, err := uuid.Parse(r.Header.Get("webhook-id"))
	if err != nil {
		http.Error(w, "webhook-id: "+err.Error(), http.StatusBadRequest)
		return
	}
	ev, err := idem.Decode(idem.Message{Body: body})
	if err != nil || ev.ID != id {
		http.Error(w, fmt.Sprintf("body: %v (event %s, webhook-id %s)", err, ev.ID, id), http.StatusBadRequest)
		return
	}
	msg := idem.Message{EventID: id, EventName: ev.Name, AggregateType: ev.AggregateType, Key: []byte(ev.AggregateID), Body: body}
	for k, v := range r.Header {
		switch k {
		case "Content-Type", "Content-Length", "User-Agent", "Accept-Encoding", "Webhook-Id", "Webhook-Timestamp", "Webhook-Signature":
			continue
		}
		if msg.Headers == nil {
			msg.Headers = map[string]string{}
		}
		msg.Headers[strings.ToLower(k)] = strings.Join(v, ", ")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.away:
		http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
	case e.refuse != nil && e.refuse(msg):
		http.Error(w, "refused: no route for "+msg.EventName, http.StatusUnprocessableEntity)
	default:
		e.accepted = append(e.accepted, msg)
	}
}

// The webhook publisher has no subscriber: it passes the publisher part of
// the conformance suite against an in-process endpoint, in both modes,
// signed and not.
func TestConformance(t *testing.T) {
	t.Run("batch", func(t *testing.T) { runConformance(t, webhook.Config{}) })
	t.Run("message", func(t *testing.T) { runConformance(t, webhook.Config{Mode: webhook.PerMessage}) })
	t.Run("batch-signed", func(t *testing.T) { runConformance(t, webhook.Config{Secrets: []string{secretA}}) })
	t.Run("message-signed", func(t *testing.T) {
		runConformance(t, webhook.Config{Mode: webhook.PerMessage, Secrets: []string{secretA, secretB}})
	})
}

func runConformance(t *testing.T, cfg webhook.Config) {
	brokertest.RunPublisher(t, brokertest.PublisherTransport{
		New: func(t *testing.T) brokertest.PublisherInstance {
			e := &endpoint{perMessage: cfg.Mode == webhook.PerMessage}
			if len(cfg.Secrets) > 0 {
				e.keys = [][]byte{decodeSecret(t, cfg.Secrets[len(cfg.Secrets)-1])}
			}
			srv := httptest.NewServer(e)
			t.Cleanup(srv.Close)
			c := cfg
			c.URL = srv.URL
			pub, err := webhook.NewPublisher(c)
			if err != nil {
				t.Fatal(err)
			}
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
