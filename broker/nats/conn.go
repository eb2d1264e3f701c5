package nats

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/internal/keyhash"
	"github.com/idem-go/idem/errlog"
	"github.com/idem-go/idem/internal/ctxsleep"
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
	// PartitionSuffix is appended to the subject prefix to form the prefix
	// of the subjects of a partitioned stream:
	// events-p.<partition>.<event name>.
	PartitionSuffix = "-p"
	// MetadataPartitions is the stream metadata key recording the number of
	// partitions of the stream ("0" when unpartitioned).
	MetadataPartitions = "idem_partitions"
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
	// PingIntervalDefault is how often the client PINGs its server.
	PingIntervalDefault = 10 * time.Second
	// MaxPingsOutstandingDefault is how many PINGs may go unanswered before
	// the client gives its server up as dead.
	MaxPingsOutstandingDefault = 2
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
	// URL is the server URL, for example nats://127.0.0.1:4222, or the
	// servers of a cluster, comma-separated:
	// nats://n1:4222,nats://n2:4222,nats://n3:4222 (or
	// nats://n1:4222,n2:4222,n3:4222). The client connects to one of them,
	// learns the others from the cluster, and moves to another when its
	// server fails. A server that freezes without closing its connections
	// is noticed by PINGs only (PingInterval, MaxPingsOutstanding): with
	// idem's defaults, within about 20 to 30 seconds (docs/OPERATIONS.md,
	// "NATS cluster"). Required unless Conn is set.
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
	// PingInterval is how often the client PINGs its server, and
	// MaxPingsOutstanding how many PINGs may go unanswered before the
	// client drops the connection and moves to another server. Together
	// they bound how long a frozen server (stopped, swapping, cut off
	// without its TCP connections closing) holds the client: PingInterval
	// x (MaxPingsOutstanding + 1) at most, 30s with the defaults of 10s
	// and 2, where nats.go's own (2 minutes and 2) take up to 6 minutes. A
	// busy but healthy server answers a PING in milliseconds; lower them
	// further to move sooner (the cluster tests use 500ms and 2).
	// nats.PingInterval and nats.MaxPingsOutstanding in Options override
	// them.
	PingInterval        time.Duration
	MaxPingsOutstanding int
	// Logger receives connection events and errors. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

func (c ConnConfig) withDefaults() ConnConfig {
	c.ReconnectWait = cmp.Or(c.ReconnectWait, ReconnectWaitDefault)
	c.DialTimeout = cmp.Or(c.DialTimeout, DialTimeoutDefault)
	c.PingInterval = cmp.Or(c.PingInterval, PingIntervalDefault)
	c.MaxPingsOutstanding = cmp.Or(c.MaxPingsOutstanding, MaxPingsOutstandingDefault)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c ConnConfig) validate(what string) error {
	if c.URL == "" && c.Conn == nil {
		return fmt.Errorf("idem: nats: %s.URL is required (or set Conn)", what)
	}
	if c.ReconnectWait < 0 || c.DialTimeout < 0 || c.PingInterval < 0 || c.MaxPingsOutstanding < 0 {
		return fmt.Errorf("idem: nats: %s.ReconnectWait, DialTimeout, PingInterval and MaxPingsOutstanding must not be negative", what)
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
		nats.PingInterval(c.PingInterval),
		nats.MaxPingsOutstanding(c.MaxPingsOutstanding),
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
	// Replicas is the number of servers of a cluster that keep the stream
	// (3 survives the loss of one). 0, the default, keeps the existing
	// stream's count and creates the stream with 1, so that a process
	// started without it never lowers a replicated stream. A positive value
	// is the count wanted: a stream with another count is updated to it
	// (logged as a warning), unless NoDeclare is set. The owners' key-value
	// bucket of the subscribers always gets the stream's count.
	Replicas int
	// MemoryStorage keeps the stream in memory instead of files. For tests.
	MemoryStorage bool
	// Partitions, when positive, partitions the stream: the publisher sends
	// each event to partition FNV-1a-32(aggregate id) mod Partitions, on
	// <SubjectPrefix>-p.<partition>.<event name>, and a subscriber reads
	// one partition (SubscriberConfig.Partition) through a durable consumer
	// of its own, <Consumer>-p<partition>: several processes of one
	// consuming service then share the work, each aggregate staying in one
	// partition. The count is recorded in the stream's metadata
	// (idem_partitions); a publisher or subscriber configured with another
	// count fails with ErrPartitions. 0 (the default) leaves the stream
	// unpartitioned: events go to <SubjectPrefix>.<event name>.
	Partitions int
}

// ErrPartitions is returned (wrapped) by NewPublisher and Subscriber.Start
// when StreamConfig.Partitions differs from the count recorded in the
// stream. Every publisher and subscriber of a stream must use the same
// count; Repartition changes it once the consumers have drained.
var ErrPartitions = errors.New("partition count differs from the stream's")

// WithDefaults returns c with zero fields set to their defaults; Replicas
// stays 0 (the existing stream's count, 1 for a new stream).
func (c StreamConfig) WithDefaults() StreamConfig {
	c.Name = cmp.Or(c.Name, StreamDefault)
	c.SubjectPrefix = cmp.Or(c.SubjectPrefix, SubjectPrefixDefault)
	c.Duplicates = cmp.Or(c.Duplicates, DuplicatesDefault)
	c.MaxAge = cmp.Or(c.MaxAge, MaxAgeDefault)
	return c
}

func (c StreamConfig) validate(what string) error {
	if err := checkToken(c.Name); err != nil {
		return fmt.Errorf("idem: nats: %s.Stream.Name %q %v", what, c.Name, err)
	}
	if err := checkSubject(c.SubjectPrefix, false); err != nil {
		return fmt.Errorf("idem: nats: %s.Stream.SubjectPrefix %q %v", what, c.SubjectPrefix, err)
	}
	if c.Duplicates < 0 || c.Replicas < 0 {
		return fmt.Errorf("idem: nats: %s.Stream: Duplicates and Replicas must not be negative (Replicas 0: the stream's own count)", what)
	}
	if c.Partitions < 0 || c.Partitions > PartitionsMax {
		return fmt.Errorf("idem: nats: %s.Stream.Partitions %d: want 0 (unpartitioned) to %d", what, c.Partitions, PartitionsMax)
	}
	return nil
}

// PartitionsMax is the most partitions a stream can have.
const PartitionsMax = 1024

// partitionPrefix returns the prefix of the subjects of a partitioned
// stream.
func (c StreamConfig) partitionPrefix() string { return c.SubjectPrefix + PartitionSuffix }

// Partition returns the partition of an event of aggregate key:
// FNV-1a 32 of key modulo c.Partitions; 0 when the stream is unpartitioned.
func (c StreamConfig) Partition(key []byte) int {
	if c.Partitions <= 0 {
		return 0
	}
	return keyhash.Mod(key, c.Partitions)
}

// PartitionSubject returns the subject of event name in partition p of a
// partitioned stream: <SubjectPrefix>-p.<p>.<name>.
func (c StreamConfig) PartitionSubject(p int, eventName string) (string, error) {
	if err := checkSubject(eventName, false); err != nil {
		return "", fmt.Errorf("idem: nats: event name %q %v", eventName, err)
	}
	return c.WithDefaults().partitionPrefix() + "." + strconv.Itoa(p) + "." + eventName, nil
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
	for _, prefix := range []string{c.retryPrefix() + ".", c.partitionPrefix() + "."} {
		if rest, ok := strings.CutPrefix(subject, prefix); ok {
			if _, name, ok := strings.Cut(rest, "."); ok {
				return name
			}
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
		Replicas:    max(c.Replicas, 1),
		Discard:     jetstream.DiscardOld,
		Metadata:    map[string]string{MetadataPartitions: strconv.Itoa(c.Partitions)},
	}
	if c.Partitions > 0 {
		sc.Subjects = append(sc.Subjects, c.partitionPrefix()+".>")
	}
	if c.MaxAge > 0 {
		sc.MaxAge = c.MaxAge
	}
	if c.MemoryStorage {
		sc.Storage = jetstream.MemoryStorage
	}
	return sc
}

// ensureStream creates the stream, or updates it to c, after checking
// that c's partition count is the stream's (unless adoptPartitions: then
// c's count is the stream's). Without declare, it only checks (a stream
// that does not exist passes). It returns c with Partitions and Replicas
// those of the stream (Replicas 1 when the stream does not exist and c
// gives none).
func ensureStream(ctx context.Context, js jetstream.JetStream, c StreamConfig, what string, declare, adoptPartitions bool, log *slog.Logger) (StreamConfig, error) {
	var stream jetstream.Stream
	err := retryUnanswered(ctx, func(ctx context.Context) (err error) {
		stream, err = js.Stream(ctx, c.Name)
		return err
	})
	var have *jetstream.StreamConfig
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
	case err != nil:
		return c, fmt.Errorf("idem: nats: look up stream %s: %w", c.Name, err)
	default:
		have = &stream.CachedInfo().Config
		if adoptPartitions {
			if c.Partitions, err = streamPartitions(*have); err != nil {
				return c, err
			}
		}
		if err := checkPartitions(*have, c, what); err != nil {
			return c, err
		}
	}
	if c.Replicas == 0 {
		// Keep the stream's count; 1 for a new stream.
		c.Replicas = 1
		if have != nil {
			c.Replicas = max(have.Replicas, 1)
		}
	}
	want := c.jetstreamConfig()
	if have != nil {
		if sameStreamConfig(*have, want) {
			// Nothing to update: spare the servers an update (and a
			// stream update racing a consumer creation, which
			// nats-server v2.15 does not guard against).
			return c, nil
		}
		if !declare {
			c.Replicas = max(have.Replicas, 1)
			return c, nil
		}
		if have.Replicas != want.Replicas {
			log.Warn("nats: changing the stream's number of replicas, as "+what+".Stream.Replicas asks",
				"stream", c.Name, "from", have.Replicas, "to", want.Replicas)
		}
	}
	if !declare {
		return c, nil
	}
	if err := retryUnanswered(ctx, func(ctx context.Context) error {
		_, err := js.CreateOrUpdateStream(ctx, want)
		return err
	}); err != nil {
		return c, fmt.Errorf("idem: nats: create or update stream %s: %w", c.Name, err)
	}
	return c, nil
}

// apiAttempt bounds one JetStream API request made while starting: a
// cluster electing its leaders can leave a request unanswered, and the
// caller's context may allow minutes.
const apiAttempt = 10 * time.Second

// retryUnanswered calls f with a context of at most apiAttempt until it
// succeeds, fails otherwise than by going unanswered, or ctx ends. f must
// be safe to repeat.
func retryUnanswered(ctx context.Context, f func(context.Context) error) error {
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		actx, cancel := context.WithTimeout(ctx, apiAttempt)
		err := f(actx)
		cancel()
		if err == nil || ctx.Err() != nil || !(unanswered(err) || errors.Is(err, context.DeadlineExceeded)) {
			return err
		}
		if !ctxsleep.Sleep(ctx, wait) {
			return err
		}
	}
}

// unanswered reports whether a JetStream API request failed for want of an
// answer (no leader yet, a leader moving): a fault, which costs time only.
func unanswered(err error) bool {
	return errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrTimeout)
}

// sameStreamConfig reports whether the stream configuration have already
// has everything idem sets in want.
func sameStreamConfig(have, want jetstream.StreamConfig) bool {
	return slices.Equal(have.Subjects, want.Subjects) &&
		have.Description == want.Description &&
		have.Retention == want.Retention &&
		have.Storage == want.Storage &&
		have.Duplicates == want.Duplicates &&
		have.Replicas == want.Replicas &&
		have.Discard == want.Discard &&
		have.MaxAge == want.MaxAge &&
		have.Metadata[MetadataPartitions] == want.Metadata[MetadataPartitions]
}

// streamPartitions returns the partition count recorded in a stream's
// configuration (0 when none is).
func streamPartitions(sc jetstream.StreamConfig) (int, error) {
	v, ok := sc.Metadata[MetadataPartitions]
	if !ok {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("idem: nats: stream %s: metadata %s=%q is not a partition count", sc.Name, MetadataPartitions, v)
	}
	return n, nil
}

// checkPartitions fails with ErrPartitions when c's partition count is not
// the one recorded in the stream.
func checkPartitions(sc jetstream.StreamConfig, c StreamConfig, what string) error {
	n, err := streamPartitions(sc)
	if err != nil {
		return err
	}
	if n != c.Partitions {
		return fmt.Errorf("idem: nats: stream %s has %d partitions (metadata %s) but %s.Stream.Partitions is %d: %w; "+
			"give every publisher and subscriber of the stream the same count, or change the stream's "+
			"(stop the relays, let every consumer drain, then call nats.Repartition)",
			c.Name, n, MetadataPartitions, what, c.Partitions, ErrPartitions)
	}
	return nil
}

// Repartition changes the partition count of an existing stream to
// c.Partitions (0: unpartitioned), recording it in the stream's metadata
// and updating its subjects. It refuses while a durable consumer of the
// stream has messages pending or unacknowledged: an aggregate's events
// published before the change stay in their old subjects, so the change is
// only safe once every consumer has drained them. The procedure: stop the
// relays (nothing is published), wait until every consumer has drained
// ("idem status"), stop the subscribers, call Repartition, then start
// publishers and subscribers configured with the new count.
func Repartition(ctx context.Context, nc *nats.Conn, c StreamConfig) error {
	c = c.WithDefaults()
	if err := c.validate("Repartition"); err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("idem: nats: %w", err)
	}
	stream, err := js.Stream(ctx, c.Name)
	if err != nil {
		return fmt.Errorf("idem: nats: repartition stream %s: %w", c.Name, err)
	}
	if c.Replicas == 0 {
		c.Replicas = stream.CachedInfo().Config.Replicas
	}
	names := stream.ConsumerNames(ctx)
	for name := range names.Name() {
		cons, err := stream.Consumer(ctx, name)
		if err != nil {
			return fmt.Errorf("idem: nats: repartition stream %s: consumer %s: %w", c.Name, name, err)
		}
		info := cons.CachedInfo()
		if info.NumPending > 0 || info.NumAckPending > 0 {
			return fmt.Errorf("idem: nats: repartition stream %s: consumer %s has %d messages pending and %d unacknowledged: stop the relays and let it drain first",
				c.Name, name, info.NumPending, info.NumAckPending)
		}
	}
	if err := names.Err(); err != nil {
		return fmt.Errorf("idem: nats: repartition stream %s: list consumers: %w", c.Name, err)
	}
	if _, err := js.UpdateStream(ctx, c.jetstreamConfig()); err != nil {
		return fmt.Errorf("idem: nats: repartition stream %s: %w", c.Name, err)
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
