// Package brokeropen opens a broker publisher from a URL for the idem and shop
// commands. Each transport adds its scheme here.
package brokeropen

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/broker/webhook"
)

// Publisher is a publisher that must be closed.
type Publisher interface {
	broker.Publisher
	Close() error
}

// Open returns a publisher for rawURL.
func Open(ctx context.Context, rawURL string) (Publisher, error) {
	if rawURL == "" {
		return nil, errors.New("no broker URL: pass --broker or set IDEM_BROKER_URL (for example amqp://guest:guest@localhost:5672/)")
	}
	if isKafkaURL(rawURL) {
		return openKafka(ctx, rawURL)
	}
	rawURL = natsURL(rawURL)
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("broker URL %s: %w", broker.RedactURL(rawURL), err)
	}
	switch strings.ToLower(u.Scheme) {
	case "amqp", "amqps":
		return openAMQP(ctx, u)
	case "nats":
		return openNATS(ctx, u, "")
	// Transports add their case here.
	case "http", "https":
		return webhook.New(rawURL, nil), nil
	default:
		return nil, fmt.Errorf("broker URL %s: scheme %q is not supported", broker.RedactURL(rawURL), u.Scheme)
	}
}

// amqpParams reads idem's own query parameters of a RabbitMQ URL, exchange
// and queue_type (a subscriber's), and returns the URL without them for
// amqp091-go.
func amqpParams(u *url.URL) (connURL, exchange string, queueType amqp.QueueType) {
	q := u.Query()
	exchange, queueType = q.Get("exchange"), amqp.QueueType(q.Get("queue_type"))
	q.Del("exchange")
	q.Del("queue_type")
	c := *u
	c.RawQuery = q.Encode()
	return c.String(), exchange, queueType
}

// openAMQP opens a RabbitMQ publisher. The query parameter "exchange" names
// the exchange (default "events"); IDEM_AMQP_USERNAME and IDEM_AMQP_PASSWORD
// supply the credentials when the URL has none.
func openAMQP(ctx context.Context, u *url.URL) (Publisher, error) {
	connURL, exchange, _ := amqpParams(u)
	cc := amqp.ConnConfig{URL: connURL, ConnectionName: "idem"}
	if u.User == nil {
		cc.Username = os.Getenv("IDEM_AMQP_USERNAME")
		cc.Password = os.Getenv("IDEM_AMQP_PASSWORD")
	}
	p, err := amqp.NewPublisher(amqp.PublisherConfig{ConnConfig: cc, Exchange: exchange})
	if err != nil {
		return nil, err
	}
	if err := p.Connect(ctx); err != nil {
		_ = p.Close()
		return nil, err
	}
	return p, nil
}
