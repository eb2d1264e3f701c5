package webhook_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/webhook"
)

func messages(t *testing.T, n int) []idem.Message {
	t.Helper()
	var out []idem.Message
	for range n {
		ev, err := idem.NewEvent("order.order.placed.v1", "order", "42", map[string]int{"lines": 2})
		if err != nil {
			t.Fatal(err)
		}
		m, err := idem.NewMessage(ev)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

func TestPublish(t *testing.T) {
	var got webhook.Request
	status := http.StatusOK
	var reply any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := json.NewDecoder(r.Body).Decode(&got); err != nil {
			t.Error(err)
		}
		w.WriteHeader(status)
		if reply != nil {
			_ = json.NewEncoder(w).Encode(reply)
		}
	}))
	defer srv.Close()
	pub := webhook.New(srv.URL, nil)
	defer pub.Close()
	msgs := messages(t, 2)

	if err := pub.Publish(context.Background(), msgs); err != nil {
		t.Fatal(err)
	}
	if len(got.Messages) != 2 || got.Messages[0].EventID != msgs[0].EventID || string(got.Messages[1].Body) != string(msgs[1].Body) ||
		string(got.Messages[0].Key) != "42" || got.Messages[0].EventName != "order.order.placed.v1" {
		t.Errorf("request = %+v", got)
	}

	reply = webhook.Response{Results: []*webhook.Result{nil, {Error: "full"}}}
	err := pub.Publish(context.Background(), msgs)
	var be *broker.BatchError
	if !errors.As(err, &be) || be.Errs[0] != nil || be.Errs[1] == nil || be.Errs[1].Error() != "full" {
		t.Errorf("per-message refusal: %v", err)
	}

	reply, status = nil, http.StatusServiceUnavailable
	err = pub.Publish(context.Background(), msgs)
	if err == nil || errors.As(err, &be) {
		t.Errorf("503: %v, want a whole-call error", err)
	}
}
