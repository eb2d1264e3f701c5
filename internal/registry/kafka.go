package registry

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/kafka"
)

// kafkaURLHelp describes the transport's URLs (BrokerURLHelp).
const kafkaURLHelp = `kafka://host:9092[,host2:9092]?tls=true&tls_ca=ca.pem&sasl=scram-sha-256&sasl_user=u&sasl_password=p (or $IDEM_KAFKA_SASL_PASSWORD)`

// kafkaTopicPrefix returns what comes before the aggregate type in the topic
// names of a URL's configuration and prefix: the URL's topic_prefix, else
// "<prefix>.outbox.event." when prefix is set, else "outbox.event.".
func kafkaTopicPrefix(uc kafka.URLConfig, prefix string) string {
	if uc.TopicPrefix != "" {
		return uc.TopicPrefix
	}
	if prefix != "" {
		return prefix + "." + kafka.TopicPrefixDefault
	}
	return kafka.TopicPrefixDefault
}

// publishKafka opens a Kafka publisher, with the topics named
// <prefix>.outbox.event.<aggregate type> when prefix is set and the URL has
// no topic_prefix, and checks that a broker answers.
func publishKafka(ctx context.Context, rawURL, prefix string) (Publisher, error) {
	uc, err := kafka.ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	cfg := uc.PublisherConfig()
	cfg.TopicReplacement = kafkaTopicPrefix(uc, prefix) + kafka.RoutedByValue
	cfg.GroupOf = func(consumer string) string { return kafkaGroup(consumer, prefix) }
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

// inspectKafka opens a Kafka publisher, which declares nothing, for its
// Inspect.
func inspectKafka(ctx context.Context, rawURL, prefix string) (Inspector, error) {
	p, err := publishKafka(ctx, rawURL, prefix)
	if err != nil {
		return nil, err
	}
	return p.(*kafka.Publisher), nil
}

// kafkaGroup returns the consumer group of consumer: its name, or
// <prefix>.<consumer> with a prefix.
func kafkaGroup(consumer, prefix string) string {
	if prefix != "" {
		return prefix + "." + consumer
	}
	return consumer
}

// subscribeKafka returns a subscriber in the consumer group cfg.Consumer
// (<prefix>.<consumer> with a prefix) on the topics of the aggregate types
// of cfg: Kafka routes by aggregate type, not by event name, and the
// consumer ignores the event names it has no handler for.
func subscribeKafka(rawURL string, cfg SubscribeConfig, names []string, deliver broker.DeliverFunc) (broker.Subscriber, error) {
	uc, err := kafka.ParseURL(rawURL)
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
		return nil, fmt.Errorf("registry: consumer %s: no aggregate type to find its Kafka topics (set SubscribeConfig.AggregateTypes)", cfg.Consumer)
	}
	prefix := kafkaTopicPrefix(uc, cfg.Prefix)
	topics := make([]string, len(types))
	for i, t := range types {
		topics[i] = prefix + t
	}
	group := kafkaGroup(cfg.Consumer, cfg.Prefix)
	sc := uc.SubscriberConfig()
	sc.ClientID = cmp.Or(sc.ClientID, group)
	sc.Logger = cfg.Logger
	sc.Group, sc.Topics, sc.TopicPrefix, sc.BatchSize = group, topics, prefix, cfg.BatchSize
	sub, err := kafka.NewSubscriber(sc, withAckFault(deliver))
	if err != nil {
		return nil, err
	}
	return &kafkaSubscriber{Subscriber: sub, client: sc.ClientConfig, topics: topics, log: cfg.Logger}, nil
}

// kafkaSubscriber creates its topics, if missing, before it starts, as a
// RabbitMQ subscriber declares its queue: the relays' producers do not
// create topics, and a consumer that starts first must not wait for them.
type kafkaSubscriber struct {
	*kafka.Subscriber
	client kafka.ClientConfig
	topics []string
	log    *slog.Logger
}

// Start creates the topics, then starts the subscriber. A Stop during the
// creation (the subscriber, stopped before it started, is then done) ends it.
func (s *kafkaSubscriber) Start(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.Subscriber.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := createTopics(ctx, s.client, s.topics); err != nil {
		// The topics may exist and the client lack the right to create
		// topics: go on, the subscriber reports what is really missing.
		s.log.Warn("kafka: creating the consumer's topics failed", "topics", s.topics, "error", err)
	}
	return s.Subscriber.Start(ctx)
}

// createTopics creates the topics that do not exist, with the brokers'
// default partition count and replication factor.
func createTopics(ctx context.Context, client kafka.ClientConfig, topics []string) error {
	opts := append([]kgo.Opt{kgo.SeedBrokers(client.Brokers...)}, client.Opts...)
	if client.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(client.TLS))
	}
	cl, err := kgo.NewClient(opts...)
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
