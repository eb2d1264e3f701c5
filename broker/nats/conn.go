package nats

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/errlog"
)

// Connection and stream defaults.
const (
	// StreamDefault is the name of the stream holding the events.
	StreamDefault = "EVENTS"
	// SubjectPrefixDefault is the first token of event subjects:
	// events.<event name>.
	SubjectPrefixDefault = "events"
	// RetrySuffix is appended to the subject prefix to form the prefix of
	// retry subjects: events-retry.<consumer>.<event name>.
	RetrySuffix = "-retry"
	// DuplicatesDefault is the stream's duplicate window: a message whose
	// Nats-Msg-Id (the event id) was stored less than this long ago is
	// acknowledged and dropped by JetStream.
	DuplicatesDefault = 2 * time.Minute
	// MaxAgeDefault is how long the stream keeps messages, acknowledged or
	// not.
	MaxAgeDefault = 7 * 24 * time.Hour
	// ReconnectWaitDefault is the delay between reconnection attempts.
	ReconnectWaitDefault = 250 * time.Millisecond
	// DialTimeoutDefault bounds the first connection.
	DialTimeoutDefault = 10 * time.Second
)

// Headers idem sets on NATS messages besides idem.HeaderEventID ("id") and
// idem.HeaderEventType ("eventType").
const (
	// HeaderKey carries idem.Message.Key (the aggregate id). The subscriber
	// moves it back to Message.Key and uses it to keep the messages of one
	// aggregate on one worker.
	HeaderKey = "idem-key"
	// HeaderAggregateType carries idem.Message.AggregateType.
	HeaderAggregateType = "idem-aggregate-type"
)

// ConnConfig says how to reach NATS. It is embedded in PublisherConfig and
// SubscriberConfig.
type ConnConfig struct {
	// URL is the server URL, for example nats://127.0.0.1:4222 (a
	// comma-separated list for a cluster). Required unless Conn is set.
	URL string
	// Conn is an open connection to use instead of dialing URL, for
	// example to an embedded server (broker/nats/embedded). It is not closed
	// by Close or Stop; its owner closes it.
	Conn *nats.Conn
	// Name is the connection name shown by the server's monitoring.
	Name string
	// Options are extra nats.go options (credentials, TLS...) applied after
	// idem's own when dialing URL.
	Options []nats.Option
	// ReconnectWait is the delay between reconnection attempts. The
	// connection reconnects forever. Defaults to 250ms.
	ReconnectWait time.Duration
	// DialTimeout bounds the first connection. Defaults to 10s.
	DialTimeout time.Duration
	// Logger receives connection events and errors. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

func (c ConnConfig) withDefaults() ConnConfig {
	c.ReconnectWait = cmp.Or(c.ReconnectWait, ReconnectWaitDefault)
	c.DialTimeout = cmp.Or(c.DialTimeout, DialTimeoutDefault)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c ConnConfig) validate(what string) error {
	if c.URL == "" && c.Conn == nil {
		return fmt.Errorf("idem: nats: %s.URL is required (or set Conn)", what)
	}
	if c.ReconnectWait < 0 || c.DialTimeout < 0 {
		return fmt.Errorf("idem: nats: %s.ReconnectWait and DialTimeout must not be negative", what)
	}
	return nil
}

// connect returns the connection to use and whether the caller owns it.
func (c ConnConfig) connect() (*nats.Conn, bool, error) {
	if c.Conn != nil {
		return c.Conn, false, nil
	}
	// The connection's failures: a disconnection, then its reconnection;
	// asynchronous errors, which may come once per message.
	errs := errlog.New(c.Logger, "nats connection", errlog.Config{})
	ctx := context.Background()
	opts := []nats.Option{
		nats.Name(c.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(c.ReconnectWait),
		nats.Timeout(c.DialTimeout),
		nats.RetryOnFailedConnect(false),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				errs.Warn(ctx, "nats: disconnected", err, "url", broker.RedactURL(c.URL))
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) {
			errs.OK(ctx) // logs "nats connection recovered"
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			errs.Warn(ctx, "nats: asynchronous error", err)
		}),
	}
	opts = append(opts, c.Options...)
	nc, err := nats.Connect(c.URL, opts...)
	if err != nil {
		return nil, false, fmt.Errorf("idem: nats: connect to %s: %w", broker.RedactURL(c.URL), err)
	}
	return nc, true, nil
}

// StreamConfig describes the stream holding the events. Publishers and
// subscribers of one system must agree on it.
type StreamConfig struct {
	// Name is the stream name. Defaults to "EVENTS".
	Name string
	// SubjectPrefix is the first token of event subjects. Defaults to
	// "events": event order.order.placed.v1 is published on
	// events.order.order.placed.v1. Retry copies for one consumer go to
	// <SubjectPrefix>-retry.<consumer>.<event name>.
	SubjectPrefix string
	// Duplicates is JetStream's duplicate window: a message whose
	// Nats-Msg-Id (the event id) was already stored within the window is
	// acknowledged but not stored again. Defaults to 2m.
	Duplicates time.Duration
	// MaxAge is how long messages are kept, whether consumed or not (the
	// stream has limits retention, so that a consumer created later, or
	// replaying, still finds them). Defaults to 7 days; negative keeps them
	// forever.
	MaxAge time.Duration
	// Replicas is the number of replicas in a cluster. Defaults to 1.
	Replicas int
	// MemoryStorage keeps the stream in memory instead of files. For tests.
	MemoryStorage bool
}

// WithDefaults returns c with zero fields set to their defaults.
func (c StreamConfig) WithDefaults() StreamConfig {
	c.Name = cmp.Or(c.Name, StreamDefault)
	c.SubjectPrefix = cmp.Or(c.SubjectPrefix, SubjectPrefixDefault)
	c.Duplicates = cmp.Or(c.Duplicates, DuplicatesDefault)
	c.MaxAge = cmp.Or(c.MaxAge, MaxAgeDefault)
	c.Replicas = cmp.Or(c.Replicas, 1)
	return c
}

func (c StreamConfig) validate(what string) error {
	if err := checkToken(c.Name); err != nil {
		return fmt.Errorf("idem: nats: %s.Stream.Name %q %v", what, c.Name, err)
	}
	if err := checkSubject(c.SubjectPrefix, false); err != nil {
		return fmt.Errorf("idem: nats: %s.Stream.SubjectPrefix %q %v", what, c.SubjectPrefix, err)
	}
	if c.Duplicates < 0 || c.Replicas < 1 {
		return fmt.Errorf("idem: nats: %s.Stream: Duplicates must not be negative and Replicas must be at least 1", what)
	}
	return nil
}

// retryPrefix returns the prefix of retry subjects.
func (c StreamConfig) retryPrefix() string { return c.SubjectPrefix + RetrySuffix }

// Subject returns the subject of event name: <SubjectPrefix>.<name>.
func (c StreamConfig) Subject(eventName string) (string, error) {
	if err := checkSubject(eventName, false); err != nil {
		return "", fmt.Errorf("idem: nats: event name %q %v", eventName, err)
	}
	return c.WithDefaults().SubjectPrefix + "." + eventName, nil
}

// RetrySubject returns the subject of a retry copy of event name for
// consumer only: <SubjectPrefix>-retry.<consumer>.<name>.
func (c StreamConfig) RetrySubject(consumer, eventName string) (string, error) {
	if err := checkToken(consumer); err != nil {
		return "", fmt.Errorf("idem: nats: consumer name %q %v", consumer, err)
	}
	if err := checkSubject(eventName, false); err != nil {
		return "", fmt.Errorf("idem: nats: event name %q %v", eventName, err)
	}
	return c.WithDefaults().retryPrefix() + "." + consumer + "." + eventName, nil
}

// eventName returns the event name of a subject of this stream, or "".
func (c StreamConfig) eventName(subject string) string {
	if rest, ok := strings.CutPrefix(subject, c.SubjectPrefix+"."); ok {
		return rest
	}
	if rest, ok := strings.CutPrefix(subject, c.retryPrefix()+"."); ok {
		if _, name, ok := strings.Cut(rest, "."); ok {
			return name
		}
	}
	return ""
}

// jetstreamConfig returns the JetStream stream configuration.
func (c StreamConfig) jetstreamConfig() jetstream.StreamConfig {
	sc := jetstream.StreamConfig{
		Name:        c.Name,
		Description: "idem events",
		Subjects:    []string{c.SubjectPrefix + ".>", c.retryPrefix() + ".>"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Duplicates:  c.Duplicates,
		Replicas:    c.Replicas,
		Discard:     jetstream.DiscardOld,
	}
	if c.MaxAge > 0 {
		sc.MaxAge = c.MaxAge
	}
	if c.MemoryStorage {
		sc.Storage = jetstream.MemoryStorage
	}
	return sc
}

// ensureStream creates the stream, or updates it to c.
func ensureStream(ctx context.Context, js jetstream.JetStream, c StreamConfig) error {
	if _, err := js.CreateOrUpdateStream(ctx, c.jetstreamConfig()); err != nil {
		return fmt.Errorf("idem: nats: create or update stream %s: %w", c.Name, err)
	}
	return nil
}

// checkSubject reports why s cannot be (with wildcards, a pattern for) a
// subject: empty, empty tokens, whitespace, or wildcards where not allowed.
func checkSubject(s string, wildcards bool) error {
	if s == "" {
		return errors.New("is empty")
	}
	tokens := strings.Split(s, ".")
	for i, tok := range tokens {
		if tok == "" {
			return errors.New("has an empty token (leading, trailing or double dot)")
		}
		if strings.ContainsAny(tok, " \t\r\n") {
			return errors.New("contains whitespace")
		}
		if tok == "*" || tok == ">" {
			if !wildcards {
				return errors.New("contains a wildcard (* or >)")
			}
			if tok == ">" && i != len(tokens)-1 {
				return errors.New("has > before its last token")
			}
			continue
		}
		if strings.ContainsAny(tok, "*>") {
			return errors.New("contains * or > inside a token")
		}
	}
	return nil
}

// checkToken reports why s cannot be one subject token or a stream or
// consumer name.
func checkToken(s string) error {
	if s == "" {
		return errors.New("is empty")
	}
	if strings.ContainsAny(s, ". \t\r\n*>/\\") {
		return errors.New("must not contain dots, whitespace, wildcards or slashes")
	}
	return nil
}
