package registry

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/kafka"
)

// kafkaURLHelp describes the transport's URLs (BrokerURLHelp).
const kafkaURLHelp = `kafka://host:9092[,host2:9092]?tls=true&tls_ca=ca.pem&sasl=scram-sha-256&sasl_user=u&sasl_password=p (or $IDEM_KAFKA_SASL_PASSWORD)`

// kafkaConfig parses kafka://host:port[,host2:port][?params] into a
// publisher configuration. Parameters:
//
//   - topic_prefix replaces "outbox.event." in the topic names
//     (<prefix><aggregate_type>);
//   - client_id sets the client id;
//   - session_timeout sets the consumer group session timeout (how long a
//     dead consumer keeps its partitions; Kafka's default is 45s);
//   - tls=true connects with TLS (system roots), tls_ca=FILE trusts FILE's
//     certificates instead, tls_cert=FILE and tls_key=FILE present a client
//     certificate (any of them implies tls=true);
//   - sasl=plain|scram-sha-256|scram-sha-512 authenticates with sasl_user
//     and sasl_password (or $IDEM_KAFKA_SASL_PASSWORD).
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
	bad := func(format string, args ...any) error {
		return fmt.Errorf("broker URL %s: %s", broker.RedactURL(rawURL), fmt.Sprintf(format, args...))
	}
	if len(cfg.Brokers) == 0 {
		return cfg, bad("no broker address (kafka://host:9092[,host2:9092])")
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return cfg, bad("%v", err)
	}
	known := []string{"topic_prefix", "client_id", "session_timeout", "tls", "tls_ca", "tls_cert", "tls_key", "sasl", "sasl_user", "sasl_password"}
	for k := range q {
		if !slices.Contains(known, k) {
			return cfg, bad("unknown parameter %q (want one of %s)", k, strings.Join(known, ", "))
		}
	}
	if p := q.Get("topic_prefix"); p != "" {
		cfg.TopicReplacement = p + kafka.RoutedByValue
	}
	cfg.ClientID = q.Get("client_id")
	if v := q.Get("session_timeout"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return cfg, bad("session_timeout %q: want a positive duration such as 10s", v)
		}
		cfg.Opts = append(cfg.Opts, kgo.SessionTimeout(d))
	}
	if cfg.TLS, err = kafkaTLS(q); err != nil {
		return cfg, bad("%v", err)
	}
	mech, err := kafkaSASL(q)
	if err != nil {
		return cfg, bad("%v", err)
	}
	if mech != nil {
		cfg.Opts = append(cfg.Opts, kgo.SASL(mech))
	}
	return cfg, nil
}

// kafkaTLS returns the TLS configuration of the parameters tls, tls_ca,
// tls_cert and tls_key, nil without TLS.
func kafkaTLS(q url.Values) (*tls.Config, error) {
	on := q.Get("tls")
	switch on {
	case "", "false", "true":
	default:
		return nil, fmt.Errorf("tls=%q: want true or false", on)
	}
	ca, cert, key := q.Get("tls_ca"), q.Get("tls_cert"), q.Get("tls_key")
	if on != "true" && ca == "" && cert == "" && key == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("tls_ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls_ca %s: no PEM certificate in it", ca)
		}
		cfg.RootCAs = pool
	}
	if (cert == "") != (key == "") {
		return nil, errors.New("tls_cert and tls_key go together")
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("tls_cert/tls_key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// kafkaSASL returns the SASL mechanism of the parameters sasl, sasl_user and
// sasl_password, nil without SASL.
func kafkaSASL(q url.Values) (sasl.Mechanism, error) {
	name := strings.ToLower(q.Get("sasl"))
	user, pass := q.Get("sasl_user"), cmp.Or(q.Get("sasl_password"), os.Getenv("IDEM_KAFKA_SASL_PASSWORD"))
	if name == "" {
		if user != "" || q.Get("sasl_password") != "" {
			return nil, errors.New("sasl_user and sasl_password need sasl=plain, scram-sha-256 or scram-sha-512")
		}
		return nil, nil
	}
	if user == "" {
		return nil, fmt.Errorf("sasl=%s needs sasl_user", name)
	}
	switch name {
	case "plain":
		return plain.Auth{User: user, Pass: pass}.AsMechanism(), nil
	case "scram-sha-256":
		return scram.Auth{User: user, Pass: pass}.AsSha256Mechanism(), nil
	case "scram-sha-512":
		return scram.Auth{User: user, Pass: pass}.AsSha512Mechanism(), nil
	}
	return nil, fmt.Errorf("sasl=%q: want plain, scram-sha-256 or scram-sha-512", name)
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

// publishKafka opens a Kafka publisher, with the topics named
// <prefix>.outbox.event.<aggregate type> when prefix is set and the URL has
// no topic_prefix, and checks that a broker answers.
func publishKafka(ctx context.Context, rawURL, prefix string) (Publisher, error) {
	cfg, err := kafkaConfig(rawURL)
	if err != nil {
		return nil, err
	}
	cfg.TopicReplacement = kafkaTopicPrefix(cfg, prefix) + kafka.RoutedByValue
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
		return nil, fmt.Errorf("registry: consumer %s: no aggregate type to find its Kafka topics (set SubscribeConfig.AggregateTypes)", cfg.Consumer)
	}
	prefix := kafkaTopicPrefix(pc, cfg.Prefix)
	topics := make([]string, len(types))
	for i, t := range types {
		topics[i] = prefix + t
	}
	group := kafkaGroup(cfg.Consumer, cfg.Prefix)
	cc := kafka.ClientConfig{Brokers: pc.Brokers, ClientID: cmp.Or(pc.ClientID, group), TLS: pc.TLS, Logger: cfg.Logger, Opts: pc.Opts}
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		ClientConfig: cc, Group: group, Topics: topics, TopicPrefix: prefix, BatchSize: cfg.BatchSize,
	}, withAckFault(deliver))
	if err != nil {
		return nil, err
	}
	return &kafkaSubscriber{Subscriber: sub, client: cc, topics: topics, log: cfg.Logger}, nil
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

func (s *kafkaSubscriber) Start(ctx context.Context) error {
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
