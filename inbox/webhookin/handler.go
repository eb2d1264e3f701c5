package webhookin

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/errlog"
	"github.com/idem-go/idem/inbox"
)

// SourcePrefix starts the source (idem.FailedMessage.Source) of the
// messages a Handler parks: "webhook:" and the consumer's name, unless
// Config.Source says otherwise. "idem failed retry", which re-drives
// through a broker, leaves them to the application (see Handler.Redeliver).
const SourcePrefix = "webhook:"

// storeTimeout bounds a write to the failure store, as the consumer bounds
// its own.
const storeTimeout = 10 * time.Second

// Consumer is what a Handler feeds: an *inbox.Consumer[TTx] of any
// transaction type.
type Consumer interface {
	// Name is the consumer's name (inbox.Config.Name).
	Name() string
	// Deliver decodes, processes and settles one delivery
	// (inbox.Consumer.Deliver).
	Deliver(ctx context.Context, d broker.Delivery) (broker.Disposition, error)
	// Failures is the consumer's failure store.
	Failures() *inbox.FailureStore
}

// Config configures a Handler.
type Config struct {
	// Provider verifies the sender's signatures and finds the event's id
	// and type in a request: StandardWebhooks, Stripe, GitHub, or a scheme
	// of your own. Required.
	Provider Provider
	// Source is the source of the messages the handler parks, which its
	// Redeliver takes back. Defaults to SourcePrefix followed by the
	// consumer's name.
	Source string
	// MaxBodyBytes bounds a request's body: a longer one is answered 413
	// and not stored (its signature cannot be checked without reading it
	// all). Defaults to idem.DefaultMaxBodyBytes (1 MiB), the consumer's
	// decoder's default limit.
	MaxBodyBytes int
	// Logger receives the refused requests (bad signatures, bodies too
	// large), each cause once per 10s with a count, and the requests parked
	// before they reach the consumer. Defaults to slog.Default().
	Logger *slog.Logger
	// Now is the clock the signatures' timestamps are checked against.
	// Defaults to time.Now.
	Now func() time.Time
}

// Handler is an http.Handler that receives a sender's webhooks into an
// idempotent consumer: see the package documentation.
type Handler struct {
	consumer Consumer
	provider Provider
	source   string
	maxBody  int
	log      *slog.Logger
	refused  *errlog.Limiter
	now      func() time.Time
}

var (
	_ http.Handler       = (*Handler)(nil)
	_ broker.Redeliverer = (*Handler)(nil)
)

// New returns a handler feeding c. Register c's handlers for the sender's
// event types (c.Handle("payment_intent.succeeded", ...)) before serving.
func New(c Consumer, cfg Config) (*Handler, error) {
	if c == nil {
		return nil, errors.New("idem: webhookin: no consumer: give the *inbox.Consumer the webhooks feed")
	}
	if cfg.Provider == nil {
		return nil, errors.New("idem: webhookin: Config.Provider is required (StandardWebhooks, Stripe, GitHub, or a Provider of your own)")
	}
	if ch, ok := cfg.Provider.(checker); ok {
		if err := ch.check(); err != nil {
			return nil, err
		}
	}
	if cfg.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("idem: webhookin: Config.MaxBodyBytes %d is negative", cfg.MaxBodyBytes)
	}
	h := &Handler{
		consumer: c,
		provider: cfg.Provider,
		source:   cmp.Or(cfg.Source, SourcePrefix+c.Name()),
		maxBody:  cmp.Or(cfg.MaxBodyBytes, idem.DefaultMaxBodyBytes),
		log:      cfg.Logger,
		now:      cfg.Now,
	}
	if h.log == nil {
		h.log = slog.Default()
	}
	h.log = h.log.With("consumer", c.Name(), "source", h.source)
	if h.now == nil {
		h.now = time.Now
	}
	h.refused = errlog.New(h.log, "webhook requests", errlog.Config{})
	return h, nil
}

// Source returns the source of the messages the handler parks.
func (h *Handler) Source() string { return h.source }

// reply is the answer to a request.
type reply struct {
	status     int
	outcome    string
	err        string
	retryAfter time.Duration
}

func (rp reply) write(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	if rp.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(rp.retryAfter.Seconds()))))
	}
	w.WriteHeader(rp.status)
	_ = json.NewEncoder(w).Encode(struct {
		Outcome string `json:"outcome,omitempty"`
		Error   string `json:"error,omitempty"`
	}{rp.outcome, rp.err})
}

// ServeHTTP verifies the request, delivers it to the consumer and answers
// once the consumer's transaction has committed: see the package
// documentation for each answer.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		reply{status: http.StatusMethodNotAllowed, err: "webhooks are POSTed"}.write(w)
		return
	}
	// The consumer's work ends with its own timeout, whether the sender
	// waits or not: a commit that the sender did not see makes its retry a
	// duplicate, where a cancellation would make every slow attempt fail.
	ctx := context.WithoutCancel(r.Context())
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(h.maxBody)))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		h.refused.Warn(ctx, "webhook refused: body over the limit, not stored; raise webhookin.Config.MaxBodyBytes if the sender's events are that large",
			nil, "max_body_bytes", h.maxBody)
		reply{status: http.StatusRequestEntityTooLarge, err: fmt.Sprintf("body over %d bytes", h.maxBody)}.write(w)
		return
	case err != nil:
		reply{status: http.StatusBadRequest, err: "the body could not be read"}.write(w)
		return
	}
	if err := h.provider.Verify(r.Header, body, h.now()); err != nil {
		h.refused.Warn(ctx, "webhook refused: signature not verified, nothing stored", err, "remote", r.RemoteAddr)
		// The reason is in the log; the answer tells a stranger nothing
		// of the secrets.
		reply{status: http.StatusUnauthorized, err: "signature not verified"}.write(w)
		return
	}
	h.refused.OK(ctx)
	h.handle(ctx, r.Header, body, "").write(w)
}

// credentialHeaders are the request headers a handler never keeps: they
// would show in "idem failed show" and the dashboard.
var credentialHeaders = map[string]bool{"authorization": true, "proxy-authorization": true, "cookie": true}

// messageHeaders returns the headers of the message of a request: the
// request's, names in lower case, several values joined by ", ", but the
// credentials and idem's own (a re-drive mark is the handler's to set).
func messageHeaders(header http.Header) map[string]string {
	out := make(map[string]string, len(header)+2)
	for k, vs := range header {
		lk := strings.ToLower(k)
		if credentialHeaders[lk] || lk == idem.HeaderRedrive || lk == idem.HeaderAttempt {
			continue
		}
		out[lk] = strings.Join(vs, ", ")
	}
	return out
}

// handle delivers a verified request to the consumer; redrive, when set,
// is the failure store id the request re-drives (idem.HeaderRedrive).
func (h *Handler) handle(ctx context.Context, header http.Header, body []byte, redrive string) reply {
	headers := messageHeaders(header)
	id, name, err := h.provider.Event(header, body)
	if err != nil {
		return h.parkUnread(ctx, headers, body, redrive, err)
	}
	msg := idem.Message{EventName: name, Headers: headers, Body: body}
	headers[idem.HeaderEventID] = id
	headers[idem.HeaderEventType] = name
	if eid, err := idem.EventID(id); err == nil {
		msg.EventID = eid
	}
	if redrive != "" {
		headers[idem.HeaderRedrive] = redrive
	}
	disp, err := h.consumer.Deliver(ctx, broker.Delivery{Message: msg, Source: h.source, Attempt: 1})
	switch {
	case err != nil:
		return reply{status: http.StatusInternalServerError, err: "not handled: try again later"}
	case disp.Action == broker.Ack && disp.Outcome == broker.Parked:
		return reply{status: http.StatusAccepted, outcome: disp.Outcome.String()}
	case disp.Action == broker.Ack:
		return reply{status: http.StatusOK, outcome: disp.Outcome.String()}
	case disp.Action == broker.Retry:
		return reply{status: http.StatusInternalServerError, outcome: disp.Outcome.String(),
			err: "a handler failed: try again later", retryAfter: max(disp.RetryAfter, time.Second)}
	default: // Pause: the consumer's database, or a dependency, is away
		return reply{status: http.StatusServiceUnavailable, outcome: disp.Outcome.String(),
			err: "a dependency is away: try again later", retryAfter: max(disp.RetryAfter, time.Second)}
	}
}

// parkUnread parks a request whose event the provider cannot read (cause)
// in the consumer's failure store, as it was received: in the entry it
// re-drives, if redrive names one of this consumer that holds body.
func (h *Handler) parkUnread(ctx context.Context, headers map[string]string, body []byte, redrive string, cause error) reply {
	if !errors.Is(cause, idem.ErrUndecodable) {
		cause = &idem.DecodeError{Err: cause}
	}
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	store := h.consumer.Failures()
	m := idem.FailedMessage{Consumer: h.consumer.Name(), Source: h.source, Headers: headers, Body: body, Error: cause.Error(), Attempts: 1}
	if id, err := strconv.ParseInt(redrive, 10, 64); err == nil && id > 0 {
		if old, err := store.Get(ctx, id); err == nil && old.Consumer == m.Consumer && bytes.Equal(old.Body, body) {
			m.ID = id
		}
	}
	id, err := store.Save(ctx, m)
	if err != nil {
		h.log.Warn("webhook could not be parked; the sender will retry", "reason", cause, "error", err)
		return reply{status: http.StatusServiceUnavailable, err: "not stored: try again later", retryAfter: time.Second}
	}
	h.log.Warn("webhook parked in failure store: its event cannot be read", "failed_message_id", id, "reason", "undecodable", "error", cause)
	return reply{status: http.StatusAccepted, outcome: broker.Parked.String()}
}

// Redeliver implements broker.Redeliverer: it hands each message, a
// request the handler parked (from inbox.Redrive, with idem.HeaderRedrive),
// to the consumer again, in the process, without checking its signature
// again (it was checked when received; its timestamp is old now). Its
// source must be the handler's. The consumer removes the entry once the
// message is applied, or parks it again in the same entry; a message it
// pauses or retries (a dependency away, a handler failing) is an error
// here, its entry left as it was. inbox.FailureStore.Retry and
// dashboard.Config.Redeliverer take a Handler (or Handlers).
func (h *Handler) Redeliver(ctx context.Context, source string, msgs []idem.Message) error {
	if source != h.source {
		return fmt.Errorf("idem: webhookin: source %q is not this handler's (%q): re-drive it through the handler that received it", source, h.source)
	}
	errs := make([]error, len(msgs))
	var failed bool
	for i, m := range msgs {
		header := make(http.Header, len(m.Headers))
		for k, v := range m.Headers {
			switch k {
			case idem.HeaderRedrive, idem.HeaderEventID, idem.HeaderEventType: // the handler's, set again
			default:
				header.Set(k, v)
			}
		}
		rp := h.handle(ctx, header, m.Body, m.Headers[idem.HeaderRedrive])
		if rp.status >= 300 {
			errs[i] = idem.Transient(fmt.Errorf("idem: webhookin: re-driven message %s not handled (%s): %s; its entry stays in the failure store",
				m.EventID, cmp.Or(rp.outcome, strconv.Itoa(rp.status)), rp.err))
			failed = true
		}
	}
	if !failed {
		return nil
	}
	if len(msgs) == 1 {
		return errs[0]
	}
	return &broker.BatchError{Errs: errs}
}

// Handlers re-drives the messages of several handlers, each to the one its
// source names: the Redeliverer of a dashboard (dashboard.Config) in an
// application that receives webhooks from several senders.
type Handlers []*Handler

var _ broker.Redeliverer = Handlers(nil)

// Redeliver implements broker.Redeliverer.
func (hs Handlers) Redeliver(ctx context.Context, source string, msgs []idem.Message) error {
	for _, h := range hs {
		if h.source == source {
			return h.Redeliver(ctx, source, msgs)
		}
	}
	return fmt.Errorf("idem: webhookin: no handler has the source %q", source)
}
