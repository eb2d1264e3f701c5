// Package webhook is a broker.Publisher that POSTs batches of messages as JSON
// to an HTTP endpoint: for systems that receive events over HTTP, and for
// tests that need a publisher in another process.
//
// One Publish call is one request:
//
//	POST /events HTTP/1.1
//	Content-Type: application/json
//
//	{"messages":[{"event_id":"0193…","event_name":"order.order.placed.v1",
//	  "aggregate_type":"order","key":"NDI=","headers":{},"body":"eyJldmVudF9pZCI6…"}]}
//
// key and body are base64 (JSON []byte). A 2xx response accepts every message
// of the request, unless its body is {"results":[…]} with one entry per
// message, {"error":"…"} refusing that message and {} or null accepting it.
// A 400, 413, 415 or 422 refuses the request's content: the publisher sends
// its messages again in halves to find the ones refused, which the relay
// quarantines after their attempts. Any other status fails the whole call.
// Receivers must be idempotent on
// event_id: the relay sends a message again when it cannot know whether it
// was accepted.
package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
)

// Message is one message of a request.
type Message struct {
	EventID       uuid.UUID         `json:"event_id"`
	EventName     string            `json:"event_name"`
	AggregateType string            `json:"aggregate_type"`
	Key           []byte            `json:"key"`
	Headers       map[string]string `json:"headers"`
	Body          []byte            `json:"body"`
}

// Request is the body of a request.
type Request struct {
	Messages []Message `json:"messages"`
}

// Result is the outcome of one message in a Response.
type Result struct {
	// Error is empty when the message was accepted.
	Error string `json:"error,omitempty"`
}

// Response is the optional body of a 2xx response.
type Response struct {
	Results []*Result `json:"results"`
}

// Publisher posts messages to one URL.
type Publisher struct {
	url    string
	client *http.Client
}

var _ broker.Publisher = (*Publisher)(nil)

// New returns a publisher posting to url with client (nil: a client with a
// 30s timeout).
func New(url string, client *http.Client) *Publisher {
	if client == nil {
		client = &http.Client{Timeout: 30 * time.Second}
	}
	return &Publisher{url: url, client: client}
}

// Close releases idle connections.
func (p *Publisher) Close() error {
	p.client.CloseIdleConnections()
	return nil
}

// Publish implements broker.Publisher.
//
// An endpoint that refuses a request's content (400 Bad Request, 413
// Content Too Large, 415 Unsupported Media Type, 422 Unprocessable Content)
// gets the messages again in halves, down to single messages, so that only
// the messages it refuses are refused (broker.Refused: the relay counts them
// toward quarantine). Any other status fails the whole call: the relay
// retries it for as long as it lasts.
func (p *Publisher) Publish(ctx context.Context, msgs []idem.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	err := p.post(ctx, msgs)
	if !broker.IsRefused(err) || len(msgs) == 1 {
		return err
	}
	errs := make([]error, len(msgs))
	half := len(msgs) / 2
	for _, part := range [][2]int{{0, half}, {half, len(msgs)}} {
		lo, hi := part[0], part[1]
		perr := p.Publish(ctx, msgs[lo:hi])
		if perr != nil && !broker.IsRefused(perr) {
			var be *broker.BatchError
			if !errors.As(perr, &be) {
				return perr // not an answer about the messages: the whole call failed
			}
		}
		copy(errs[lo:hi], broker.Results(perr, hi-lo))
	}
	for _, e := range errs {
		if e != nil {
			return &broker.BatchError{Errs: errs}
		}
	}
	return nil
}

// refusedStatus reports whether an HTTP status says that the endpoint
// refuses the request's content, which sending it again will not change.
func refusedStatus(code int) bool {
	switch code {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType, http.StatusUnprocessableEntity:
		return true
	}
	return false
}

// post sends msgs in one request.
func (p *Publisher) post(ctx context.Context, msgs []idem.Message) error {
	req := Request{Messages: make([]Message, len(msgs))}
	for i, m := range msgs {
		req.Messages[i] = Message{
			EventID: m.EventID, EventName: m.EventName, AggregateType: m.AggregateType,
			Key: m.Key, Headers: m.Headers, Body: m.Body,
		}
	}
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	httpReq, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	httpReq.Header.Set("Content-Type", idem.ContentTypeJSON)
	resp, err := p.client.Do(httpReq)
	if err != nil {
		return fmt.Errorf("idem: webhook: POST %s: %w", broker.RedactURL(p.url), err)
	}
	defer resp.Body.Close()
	respBody, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("idem: webhook: POST %s: read response: %w", broker.RedactURL(p.url), err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		snippet := bytes.TrimSpace(respBody)
		if len(snippet) > 200 {
			snippet = snippet[:200]
		}
		err := fmt.Errorf("idem: webhook: POST %s: status %d: %s", broker.RedactURL(p.url), resp.StatusCode, snippet)
		if refusedStatus(resp.StatusCode) {
			return broker.Refused(err)
		}
		return err
	}
	if len(bytes.TrimSpace(respBody)) == 0 {
		return nil
	}
	var r Response
	if err := json.Unmarshal(respBody, &r); err != nil || r.Results == nil {
		return nil // Any other 2xx body accepts the batch.
	}
	if len(r.Results) != len(msgs) {
		return fmt.Errorf("idem: webhook: POST %s: %d results for %d messages", broker.RedactURL(p.url), len(r.Results), len(msgs))
	}
	errs := make([]error, len(msgs))
	var failed bool
	for i, res := range r.Results {
		if res != nil && res.Error != "" {
			errs[i] = errors.New(res.Error)
			failed = true
		}
	}
	if failed {
		return &broker.BatchError{Errs: errs}
	}
	return nil
}
