// Package webhook is a broker.Publisher that POSTs messages to an HTTP
// endpoint: for systems that receive events over HTTP, and for tests that
// need a publisher in another process.
//
// In the default mode, Batch, one Publish call is one request:
//
//	POST /events HTTP/1.1
//	Content-Type: application/json
//	webhook-id: 5d0c…
//	webhook-timestamp: 1767340800
//	webhook-signature: v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=
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
//
// In the mode PerMessage, each message is a request of its own, its body
// the message's body as it is (the JSON envelope, Content-Type
// application/json unless the message has a content-type header), each of
// its headers an HTTP header, and webhook-id its event id: what any
// Standard Webhooks receiver (inbox/webhookin among them) reads,
// deduplicating on webhook-id. A 2xx accepts the message, a 400, 413, 415
// or 422 refuses it, any other status stops the call there (the messages
// before it are accepted, the others are not sent).
//
// # Signatures
//
// Every request carries webhook-id and webhook-timestamp (the attempt's
// time in unix seconds). With Config.Secrets (the URL parameters
// secret_file and secret_env), every request is also signed as Standard
// Webhooks (https://www.standardwebhooks.com/) specifies: webhook-signature
// is "v1,<base64 HMAC-SHA256 of <id>.<timestamp>.<body>>", one signature
// per secret, space-separated, so that a receiver moves from one secret to
// the next without downtime. A secret is "whsec_<base64>", the key being
// the decoded bytes (24 to 64).
//
// The spec's webhook-id identifies one message, the same in every attempt.
// A batch holds several: its webhook-id is the name-based UUID (version 5)
// of its event ids in order (BatchID), the same whenever the same messages
// are sent together again, and a receiver deduplicates the batch's messages
// on their event_id, never on the batch's webhook-id. Use PerMessage when
// the receiver follows the spec's model of one message per request.
package webhook

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/internal/stdwebhook"
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

// Mode says how the messages of a Publish call map to requests.
type Mode string

// Modes.
const (
	// Batch sends the messages of a Publish call in one request, a Request.
	Batch Mode = "batch"
	// PerMessage sends each message in a request of its own, its body as
	// it is and its event id in webhook-id.
	PerMessage Mode = "message"
)

// Config configures a Publisher (NewPublisher).
type Config struct {
	// URL is the endpoint the publisher POSTs to. Required.
	URL string
	// Client sends the requests. Defaults to a client with a 30s timeout.
	Client *http.Client
	// Mode says how messages map to requests. Defaults to Batch.
	Mode Mode
	// Secrets, when set, sign every request with Standard Webhooks, one
	// signature per secret ("whsec_<base64>", a key of 24 to 64 bytes): to
	// rotate, add the new secret, move the receiver to it, then remove the
	// old one. Empty: requests are not signed. Never log a Config.
	Secrets []string
	// Now is the clock of webhook-timestamp. Defaults to time.Now.
	Now func() time.Time
}

// Publisher posts messages to one URL.
type Publisher struct {
	url    string
	client *http.Client
	mode   Mode
	keys   [][]byte
	now    func() time.Time
}

var _ broker.Publisher = (*Publisher)(nil)

// New returns a publisher posting batches, unsigned, to url with client
// (nil: a client with a 30s timeout): NewPublisher with Config{URL: url,
// Client: client}.
func New(url string, client *http.Client) *Publisher {
	p, _ := newPublisher(Config{URL: url, Client: client})
	return p
}

// NewPublisher returns a publisher configured by cfg. Its errors name the
// field and never quote a secret.
func NewPublisher(cfg Config) (*Publisher, error) {
	if cfg.URL == "" {
		return nil, errors.New("idem: webhook: Config.URL is required (the endpoint, https://host/path)")
	}
	switch cfg.Mode {
	case "", Batch, PerMessage:
	default:
		return nil, fmt.Errorf("idem: webhook: Config.Mode %q: want %q or %q", cfg.Mode, Batch, PerMessage)
	}
	return newPublisher(cfg)
}

func newPublisher(cfg Config) (*Publisher, error) {
	p := &Publisher{url: cfg.URL, client: cfg.Client, mode: cmp.Or(cfg.Mode, Batch), now: cfg.Now}
	if p.client == nil {
		p.client = &http.Client{Timeout: 30 * time.Second}
	}
	if p.now == nil {
		p.now = time.Now
	}
	for i, s := range cfg.Secrets {
		key, err := stdwebhook.ParseSigningSecret(s)
		if err != nil {
			return nil, fmt.Errorf("idem: webhook: Config.Secrets[%d]: %w", i, err)
		}
		p.keys = append(p.keys, key)
	}
	return p, nil
}

// Close releases idle connections.
func (p *Publisher) Close() error {
	p.client.CloseIdleConnections()
	return nil
}

// BatchID returns the webhook-id of a request of the mode Batch carrying
// the messages of ids, in that order: the name-based UUID (version 5), in
// the namespace idem.EventIDNamespace, of "batch:" followed by the ids
// joined by commas. The same messages sent together again have the same
// id; it names no event.
func BatchID(ids []uuid.UUID) string {
	var b strings.Builder
	b.WriteString("batch:")
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(id.String())
	}
	return uuid.NewSHA1(uuid.MustParse(idem.EventIDNamespace), []byte(b.String())).String()
}

// Publish implements broker.Publisher.
//
// In the mode PerMessage, the messages are sent one after the other, in
// order: a message refused (400, 413, 415, 422, or a header HTTP cannot
// carry) is refused alone, the next one is sent; any other failure stops
// there, the messages after it unsent (faults, idem.Transient, in the
// *broker.BatchError; the whole call's error when it is the first).
//
// In the mode Batch, an endpoint that refuses a request's content (400 Bad
// Request, 413 Content Too Large, 415 Unsupported Media Type, 422
// Unprocessable Content) gets the messages again in halves, down to single
// messages, so that only the messages it refuses are refused
// (broker.Refused: the relay counts them toward quarantine). Any other
// status fails the whole call: the relay retries it for as long as it
// lasts.
func (p *Publisher) Publish(ctx context.Context, msgs []idem.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	if p.mode == PerMessage {
		return p.publishEach(ctx, msgs)
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
	ids := make([]uuid.UUID, len(msgs))
	for i, m := range msgs {
		req.Messages[i] = Message{
			EventID: m.EventID, EventName: m.EventName, AggregateType: m.AggregateType,
			Key: m.Key, Headers: m.Headers, Body: m.Body,
		}
		ids[i] = m.EventID
	}
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	h := http.Header{"Content-Type": {idem.ContentTypeJSON}}
	respBody, err := p.send(ctx, h, BatchID(ids), body)
	if err != nil || len(bytes.TrimSpace(respBody)) == 0 {
		return err
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

// publishEach sends msgs one request each, in order (mode PerMessage).
func (p *Publisher) publishEach(ctx context.Context, msgs []idem.Message) error {
	errs := make([]error, len(msgs))
	var failed bool
	for i, m := range msgs {
		err := p.postOne(ctx, m)
		if err == nil {
			continue
		}
		failed = true
		if broker.IsRefused(err) {
			errs[i] = err
			continue
		}
		if i == 0 {
			return err // nothing accepted: the whole call failed
		}
		errs[i] = idem.Transient(err)
		for j := i + 1; j < len(msgs); j++ {
			errs[j] = idem.Transient(fmt.Errorf("idem: webhook: not sent: the message before it failed: %w", err))
		}
		break
	}
	if failed {
		return &broker.BatchError{Errs: errs}
	}
	return nil
}

// reservedHeaders are the request headers a message header cannot set:
// the request's own (transport, Standard Webhooks). content-type sets the
// request's Content-Type.
var reservedHeaders = map[string]bool{
	"Content-Length": true, "Host": true, "Transfer-Encoding": true, "Connection": true,
	"Te": true, "Trailer": true, "Upgrade": true, "Keep-Alive": true, "Expect": true,
	"Proxy-Connection": true, "Webhook-Id": true, "Webhook-Timestamp": true, "Webhook-Signature": true,
}

// postOne sends m in a request of its own (mode PerMessage).
func (p *Publisher) postOne(ctx context.Context, m idem.Message) error {
	h := http.Header{}
	for k, v := range m.Headers {
		ck := http.CanonicalHeaderKey(k)
		if !validHeaderName(k) || reservedHeaders[ck] || !validHeaderValue(v) {
			return broker.Refused(fmt.Errorf("idem: webhook: message %s: header %q cannot be sent as an HTTP header (a name that is not an HTTP token or that the request sets itself, or a value with a control character)",
				m.EventID, cut(k)))
		}
		h[ck] = append(h[ck], v)
	}
	if h.Get("Content-Type") == "" {
		h.Set("Content-Type", idem.ContentTypeJSON)
	}
	_, err := p.send(ctx, h, m.EventID.String(), m.Body)
	return err
}

// send POSTs body with the headers h, webhook-id id and webhook-timestamp,
// signed when the publisher has keys, and returns the body of a 2xx
// response. Another
// status is an error, marked broker.Refused when it refuses the content.
func (p *Publisher) send(ctx context.Context, h http.Header, id string, body []byte) ([]byte, error) {
	httpReq, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	httpReq.Header = h
	stdwebhook.Sign(h, p.keys, id, p.now(), body)
	resp, err := p.client.Do(httpReq)
	if err != nil {
		return nil, fmt.Errorf("idem: webhook: POST %s: %w", broker.RedactURL(p.url), err)
	}
	defer resp.Body.Close()
	respBody, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("idem: webhook: POST %s: read response: %w", broker.RedactURL(p.url), err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		snippet := bytes.TrimSpace(respBody)
		if len(snippet) > 200 {
			snippet = snippet[:200]
		}
		err := fmt.Errorf("idem: webhook: POST %s: status %d: %s", broker.RedactURL(p.url), resp.StatusCode, snippet)
		if refusedStatus(resp.StatusCode) {
			return nil, broker.Refused(err)
		}
		return nil, err
	}
	return respBody, nil
}

// validHeaderName reports whether s is an HTTP field name (a token).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// validHeaderValue reports whether s can be an HTTP field value: no
// control character but tab.
func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// cut shortens a name for an error.
func cut(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
