package brokeropen

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/kafka"
)

// isKafkaURL reports whether rawURL has the kafka scheme. Kafka URLs list
// several brokers (kafka://host1:9092,host2:9092), which url.Parse rejects,
// so they are recognised before parsing.
func isKafkaURL(rawURL string) bool {
	scheme, _, ok := strings.Cut(rawURL, "://")
	return ok && strings.EqualFold(scheme, "kafka")
}

// kafkaConfig parses kafka://host:port[,host2:port][?topic_prefix=...] into
// a publisher configuration. topic_prefix replaces "outbox.event." in the
// topic names (<prefix><aggregate_type>); client_id sets the client id;
// session_timeout sets the consumer group session timeout (how long a dead
// consumer keeps its partitions; Kafka's default is 45s).
func kafkaConfig(rawURL string) (kafka.PublisherConfig, error) {
	_, rest, _ := strings.Cut(rawURL, "://")
	hosts, query, _ := strings.Cut(rest, "?")
	hosts = strings.TrimSuffix(hosts, "/")
	var cfg kafka.PublisherConfig
	for _, h := range strings.Split(hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			cfg.Brokers = append(cfg.Brokers, h)
		}
	}
	if len(cfg.Brokers) == 0 {
		return cfg, fmt.Errorf("broker URL %s: no broker address (kafka://host:9092[,host2:9092])", broker.RedactURL(rawURL))
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return cfg, fmt.Errorf("broker URL %s: %w", broker.RedactURL(rawURL), err)
	}
	for k := range q {
		switch k {
		case "topic_prefix", "client_id", "session_timeout":
		default:
			return cfg, fmt.Errorf("broker URL %s: unknown parameter %q (want topic_prefix, client_id or session_timeout)", broker.RedactURL(rawURL), k)
		}
	}
	if p := q.Get("topic_prefix"); p != "" {
		cfg.TopicReplacement = p + kafka.RoutedByValue
	}
	cfg.ClientID = q.Get("client_id")
	if v := q.Get("session_timeout"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return cfg, fmt.Errorf("broker URL %s: session_timeout %q: want a positive duration such as 10s", broker.RedactURL(rawURL), v)
		}
		cfg.Opts = append(cfg.Opts, kgo.SessionTimeout(d))
	}
	return cfg, nil
}

func openKafka(ctx context.Context, rawURL string) (Publisher, error) {
	cfg, err := kafkaConfig(rawURL)
	if err != nil {
		return nil, err
	}
	p, err := kafka.NewPublisher(cfg)
	if err != nil {
		return nil, err
	}
	if err := p.Ping(ctx); err != nil {
		_ = p.Close()
		return nil, fmt.Errorf("broker URL %s: %w", broker.RedactURL(rawURL), err)
	}
	return p, nil
}

// kafkaTopicPrefix returns what comes before the aggregate type in the topic
// names of rawURL's configuration and prefix: the URL's topic_prefix, else
// "<prefix>.outbox.event." when prefix is set, else "outbox.event.".
func kafkaTopicPrefix(cfg kafka.PublisherConfig, prefix string) string {
	if cfg.TopicReplacement != "" {
		return strings.TrimSuffix(cfg.TopicReplacement, kafka.RoutedByValue)
	}
	if prefix != "" {
		return prefix + "." + kafka.TopicPrefixDefault
	}
	return kafka.TopicPrefixDefault
}

// openKafkaPrefixed is openKafka with the topics named
// <prefix>.outbox.event.<aggregate type> when prefix is set and the URL has
// no topic_prefix.
func openKafkaPrefixed(ctx context.Context, rawURL, prefix string) (Publisher, error) {
	cfg, err := kafkaConfig(rawURL)
	if err != nil {
		return nil, err
	}
	cfg.TopicReplacement = kafkaTopicPrefix(cfg, prefix) + kafka.RoutedByValue
	p, err := kafka.NewPublisher(cfg)
	if err != nil {
		return nil, err
	}
	if err := p.Ping(ctx); err != nil {
		_ = p.Close()
		return nil, fmt.Errorf("broker URL %s: %w", broker.RedactURL(rawURL), err)
	}
	return p, nil
}

// subscribeKafka returns a subscriber in the consumer group cfg.Consumer
// (<prefix>.<consumer> with a prefix) on the topics of the aggregate types
// of cfg: Kafka routes by aggregate type, not by event name, and the
// consumer ignores the event names it has no handler for.
func subscribeKafka(rawURL string, cfg SubscribeConfig, names []string, deliver broker.DeliverFunc) (Subscriber, error) {
	pc, err := kafkaConfig(rawURL)
	if err != nil {
		return nil, err
	}
	types := slices.Clone(cfg.AggregateTypes)
	if len(types) == 0 {
		for _, n := range names {
			// <service>.<aggregate>.<event>.v<N>
			if parts := strings.Split(n, "."); len(parts) >= 4 {
				types = append(types, parts[1])
			}
		}
	}
	slices.Sort(types)
	types = slices.Compact(types)
	if len(types) == 0 {
		return nil, fmt.Errorf("brokeropen: consumer %s: no aggregate type to find its Kafka topics (set SubscribeConfig.AggregateTypes)", cfg.Consumer)
	}
	prefix := kafkaTopicPrefix(pc, cfg.Prefix)
	topics := make([]string, len(types))
	for i, t := range types {
		topics[i] = prefix + t
	}
	group := cfg.Consumer
	if cfg.Prefix != "" {
		group = cfg.Prefix + "." + group
	}
	cc := kafka.ClientConfig{Brokers: pc.Brokers, ClientID: cmp.Or(pc.ClientID, group), Logger: cfg.Logger, Opts: pc.Opts}
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		ClientConfig: cc, Group: group, Topics: topics, TopicPrefix: prefix, BatchSize: cfg.BatchSize,
	}, deliver)
	if err != nil {
		return nil, err
	}
	return &kafkaSubscriber{Subscriber: sub, brokers: pc.Brokers, topics: topics, log: cfg.Logger}, nil
}

// kafkaSubscriber creates its topics, if missing, before it starts, as a
// RabbitMQ subscriber declares its queue: the relays' producers do not
// create topics, and a consumer that starts first must not wait for them.
type kafkaSubscriber struct {
	*kafka.Subscriber
	brokers, topics []string
	log             *slog.Logger
}

func (s *kafkaSubscriber) Start(ctx context.Context) error {
	if err := createTopics(ctx, s.brokers, s.topics); err != nil {
		// The topics may exist and the client lack the right to create
		// topics: go on, the subscriber reports what is really missing.
		s.log.Warn("kafka: creating the consumer's topics failed", "topics", s.topics, "error", err)
	}
	return s.Subscriber.Start(ctx)
}

// createTopics creates the topics that do not exist, with the brokers'
// default partition count and replication factor.
func createTopics(ctx context.Context, brokers, topics []string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	res, err := kadm.NewClient(cl).CreateTopics(ctx, -1, -1, nil, topics...)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range res.Sorted() {
		if r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
			errs = append(errs, fmt.Errorf("topic %s: %w", r.Topic, r.Err))
		}
	}
	return errors.Join(errs...)
}
