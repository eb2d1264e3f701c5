// Package registry opens databases and brokers from URLs, for the idem and
// shop commands: one table of schemes per kind (databaseSchemes, and the
// broker schemes in broker.go), each scheme's opener in its own file. The
// URLs are parsed by the public functions beside each transport and dialect
// (amqp.ParseURL, kafka.ParseURL, nats.ParseURL, webhook.ParseURL,
// postgres.OpenURL, mysql.OpenURL, sqlite.OpenURL); the registry adds the
// commands' conventions (names with a prefix, a database per name, the
// embedded NATS server shared in the process). Adding a dialect or a
// transport adds its opener and a line to its table.
package registry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/webhook"
	"github.com/idem-go/idem/internal/redact"
)

// Publisher is a publisher that must be closed.
type Publisher interface {
	broker.Publisher
	Close() error
}

// transport is what a transport provides to the registry.
type transport struct {
	// schemes are the URL schemes it answers to.
	schemes []string
	// help describes its URLs, for --help texts (BrokerURLHelp).
	help string
	// publish opens a publisher of rawURL; prefix, when set, prefixes the
	// broker's names (see OpenPrefixed).
	publish func(ctx context.Context, rawURL, prefix string) (Publisher, error)
	// subscribe returns a subscriber, not started, of names (the event
	// names, without AnyEvent) for cfg. Nil when the transport cannot
	// subscribe.
	subscribe func(rawURL string, cfg SubscribeConfig, names []string, deliver broker.DeliverFunc) (broker.Subscriber, error)
	// inspect opens an inspector of rawURL that declares nothing (see
	// OpenInspector). Nil when the transport cannot tell what waits.
	inspect func(ctx context.Context, rawURL, prefix string) (Inspector, error)
	// partitions returns the partitions rawURL gives a consumer's queue or
	// stream (its parameter partitions), 0 when none. Nil when the
	// transport partitions by itself (Kafka) or cannot subscribe.
	partitions func(rawURL string) (int, error)
}

// transports are the broker transports, in the order --help lists them:
// adding a transport adds its file (its openers and help) and a line here.
var transports = []transport{
	{[]string{"amqp", "amqps"}, amqpURLHelp, publishAMQP, subscribeAMQP, inspectAMQP, partitionsAMQP},
	{[]string{"kafka"}, kafkaURLHelp, publishKafka, subscribeKafka, inspectKafka, nil},
	{[]string{"nats", "tls"}, natsURLHelp, publishNATS, subscribeNATS, inspectNATS, partitionsNATS},
	{[]string{"http", "https"}, webhookURLHelp, publishWebhook, nil, nil, nil},
}

// brokerSchemes maps each broker URL scheme to its transport.
var brokerSchemes = func() map[string]transport {
	m := map[string]transport{}
	for _, t := range transports {
		for _, s := range t.schemes {
			m[s] = t
		}
	}
	return m
}()

// BrokerURLHelp describes the broker URLs, one transport per line, for
// --help texts.
func BrokerURLHelp() string {
	lines := make([]string, len(transports))
	for i, t := range transports {
		lines[i] = t.help
	}
	return strings.Join(lines, ",\n") + ";\nany of them publishes CloudEvents with ?cloudevents=binary or ?cloudevents=structured (&cloudevents_source=/shop/order)"
}

// BrokerSchemes returns the supported broker URL schemes, sorted.
func BrokerSchemes() []string {
	out := make([]string, 0, len(brokerSchemes))
	for s := range brokerSchemes {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// brokerSchemeOf returns the transport of rawURL, whose scheme is read
// without url.Parse: Kafka URLs list several hosts (kafka://a:9092,b:9092),
// which url.Parse rejects. "embedded" is the embedded NATS server.
func brokerSchemeOf(rawURL string) (transport, error) {
	if rawURL == "" {
		return transport{}, errors.New("no broker URL: pass --broker, --broker-file FILE or set IDEM_BROKER_URL (for example amqp://localhost:5672/; a URL with a password in the variable or the file)")
	}
	if rawURL == "embedded" || strings.HasPrefix(rawURL, "embedded?") {
		return brokerSchemes["nats"], nil
	}
	scheme, _, ok := strings.Cut(rawURL, "://")
	if !ok {
		return transport{}, fmt.Errorf("broker URL %s has no scheme: want one of %s", broker.RedactURL(rawURL), strings.Join(BrokerSchemes(), ", "))
	}
	t, ok := brokerSchemes[strings.ToLower(scheme)]
	if !ok {
		return transport{}, fmt.Errorf("broker URL %s: scheme %q is not supported: want one of %s", broker.RedactURL(rawURL), scheme, strings.Join(BrokerSchemes(), ", "))
	}
	return t, nil
}

// Open returns a publisher for rawURL.
func Open(ctx context.Context, rawURL string) (Publisher, error) {
	return OpenPrefixed(ctx, rawURL, "")
}

// OpenPrefixed is Open with the names of SubscribeConfig.Prefix when prefix
// is set: exchange <prefix>.events (RabbitMQ), topics
// <prefix>.outbox.event.<aggregate type> (Kafka), stream <PREFIX>_EVENTS and
// subjects <prefix>.events.<event name> (NATS). Its errors, as those of
// every function of the registry, never hold the URL's password.
func OpenPrefixed(ctx context.Context, rawURL, prefix string) (Publisher, error) {
	t, err := brokerSchemeOf(rawURL)
	if err != nil {
		return nil, err
	}
	pub, err := t.publish(ctx, rawURL, prefix)
	return pub, redact.Error(err)
}

// Inspector is a broker.Inspector that must be closed.
type Inspector interface {
	broker.Inspector
	Close() error
}

// OpenInspector returns an inspector of the broker at rawURL, which tells
// what waits for each consumer ("idem status", the dashboard), finding
// consumers' queues and groups by the names of SubscribeConfig with prefix.
// Unlike Open, it declares nothing: no exchange, no stream.
func OpenInspector(ctx context.Context, rawURL, prefix string) (Inspector, error) {
	t, err := brokerSchemeOf(rawURL)
	if err != nil {
		return nil, err
	}
	if t.inspect == nil {
		return nil, fmt.Errorf("broker URL %s: this transport cannot tell what waits for a consumer; give an amqp://, kafka:// or nats:// URL", broker.RedactURL(rawURL))
	}
	ins, err := t.inspect(ctx, rawURL, prefix)
	return ins, redact.Error(err)
}

// webhookURLHelp describes the webhook URLs, for --help texts.
const webhookURLHelp = `http(s)://host/path (POST batches as JSON, or one message per request with ?mode=message; signed as Standard Webhooks with ?secret_file=PATH or ?secret_env=NAME)`

// publishWebhook returns a publisher posting to rawURL.
func publishWebhook(_ context.Context, rawURL, _ string) (Publisher, error) {
	uc, err := webhook.ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	return webhook.NewPublisher(uc.Config())
}
