// Package registry opens databases and brokers from URLs, for the idem and
// shop commands and the shop's stores alike: one table of schemes per kind
// (databaseSchemes, and the broker schemes in broker.go), each scheme's
// opener in its own file. Adding a dialect or a transport adds its opener
// and a line to its table.
package registry

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/webhook"
)

// Publisher is a publisher that must be closed.
type Publisher interface {
	broker.Publisher
	Close() error
}

// brokerScheme is what a transport provides to the registry.
type brokerScheme struct {
	// publish opens a publisher of rawURL; prefix, when set, prefixes the
	// broker's names (see OpenPrefixed).
	publish func(ctx context.Context, rawURL, prefix string) (Publisher, error)
	// subscribe returns a subscriber, not started, of names (the event
	// names, without AnyEvent) for cfg. Nil when the transport cannot
	// subscribe.
	subscribe func(rawURL string, cfg SubscribeConfig, names []string, deliver broker.DeliverFunc) (broker.Subscriber, error)
}

// brokerSchemes maps each broker URL scheme to its transport: adding a
// transport adds its opener file and a line here.
var brokerSchemes = map[string]brokerScheme{
	"amqp":  {publishAMQP, subscribeAMQP},
	"amqps": {publishAMQP, subscribeAMQP},
	"kafka": {publishKafka, subscribeKafka},
	"nats":  {publishNATS, subscribeNATS},
	"tls":   {publishNATS, subscribeNATS}, // NATS over TLS
	"http":  {publishWebhook, nil},
	"https": {publishWebhook, nil},
}

// BrokerURLHelp describes the broker URLs, for --help texts.
const BrokerURLHelp = `amqp://user:pass@host:5672/ or amqps://...?cacertfile=ca.pem&certfile=c.pem&keyfile=k.pem (?queue_type=quorum, ?exchange=),
kafka://host:9092[,host2:9092]?tls=true&tls_ca=ca.pem&sasl=scram-sha-256&sasl_user=u&sasl_password=p (or $IDEM_KAFKA_SASL_PASSWORD),
nats://user:pass@host:4222 or tls://host:4222?ca=ca.pem&cert=c.pem&key=k.pem&creds=user.creds, embedded (a NATS server in the process: ?dir=, ?listen=, ?sync=interval),
http(s)://... (POST batches as JSON)`

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
func brokerSchemeOf(rawURL string) (brokerScheme, error) {
	if rawURL == "" {
		return brokerScheme{}, errors.New("no broker URL: pass --broker or set IDEM_BROKER_URL (for example amqp://guest:guest@localhost:5672/)")
	}
	if rawURL == "embedded" || strings.HasPrefix(rawURL, "embedded?") {
		return brokerSchemes["nats"], nil
	}
	scheme, _, ok := strings.Cut(rawURL, "://")
	if !ok {
		return brokerScheme{}, fmt.Errorf("broker URL %s has no scheme: want one of %s", broker.RedactURL(rawURL), strings.Join(BrokerSchemes(), ", "))
	}
	t, ok := brokerSchemes[strings.ToLower(scheme)]
	if !ok {
		return brokerScheme{}, fmt.Errorf("broker URL %s: scheme %q is not supported: want one of %s", broker.RedactURL(rawURL), scheme, strings.Join(BrokerSchemes(), ", "))
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
// subjects <prefix>.events.<event name> (NATS).
func OpenPrefixed(ctx context.Context, rawURL, prefix string) (Publisher, error) {
	t, err := brokerSchemeOf(rawURL)
	if err != nil {
		return nil, err
	}
	return t.publish(ctx, rawURL, prefix)
}

// parseURL parses a broker URL that url.Parse accepts.
func parseURL(rawURL string) (*url.URL, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("broker URL %s: %w", broker.RedactURL(rawURL), err)
	}
	return u, nil
}

func publishWebhook(_ context.Context, rawURL, _ string) (Publisher, error) {
	return webhook.New(rawURL, nil), nil
}
