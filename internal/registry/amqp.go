package registry

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/amqp"
)

// amqpURLHelp describes the transport's URLs (BrokerURLHelp).
const amqpURLHelp = `amqp://user:pass@host:5672/ or amqps://...?cacertfile=ca.pem&certfile=c.pem&keyfile=k.pem (?queue_type=quorum, ?exchange=, ?partitions=8&partition=3); a cluster: amqp://user:pass@h1:5672,h2:5672,h3:5672/`

// parseAMQPURL checks a RabbitMQ URL, which may list the nodes of a cluster
// (amqp://user:pass@h1:5672,h2:5672/vhost), and returns its first host's
// URL, which has the credentials and query parameters of all.
func parseAMQPURL(rawURL string) (*url.URL, error) {
	urls, err := amqp.SplitURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("broker URL %w", err)
	}
	return parseURL(urls[0])
}

// amqpParams reads idem's own query parameters of a RabbitMQ URL, exchange
// and queue_type (a subscriber's; partitions and partition are read by
// amqpPartitions), and returns the URL without them for
// amqp091-go, which reads the TLS ones (cacertfile, certfile, keyfile,
// server_name_indication) of amqps:// URLs itself. u is parseAMQPURL's
// result for rawURL; the hosts of rawURL are kept.
func amqpParams(rawURL string, u *url.URL) (connURL, exchange string, queueType amqp.QueueType) {
	q := u.Query()
	exchange, queueType = q.Get("exchange"), amqp.QueueType(q.Get("queue_type"))
	q.Del("exchange")
	q.Del("queue_type")
	q.Del("partitions")
	q.Del("partition")
	connURL, _, _ = strings.Cut(rawURL, "#")
	connURL, _, _ = strings.Cut(connURL, "?")
	if len(q) > 0 {
		connURL += "?" + q.Encode()
	}
	return connURL, exchange, queueType
}

// amqpConn returns the connection settings of u; IDEM_AMQP_USERNAME and
// IDEM_AMQP_PASSWORD supply the credentials when the URL has none.
func amqpConn(connURL string, u *url.URL, name string) amqp.ConnConfig {
	cc := amqp.ConnConfig{URL: connURL, ConnectionName: name}
	if u.User == nil {
		cc.Username = os.Getenv("IDEM_AMQP_USERNAME")
		cc.Password = os.Getenv("IDEM_AMQP_PASSWORD")
	}
	return cc
}

// publishAMQP opens a RabbitMQ publisher. The query parameter "exchange"
// names the exchange (default "events", or "<prefix>.events").
func publishAMQP(ctx context.Context, rawURL, prefix string) (Publisher, error) {
	u, err := parseAMQPURL(rawURL)
	if err != nil {
		return nil, err
	}
	connURL, exchange, _ := amqpParams(rawURL, u)
	named, _ := SubscribeConfig{Prefix: prefix}.Names()
	p, err := amqp.NewPublisher(amqp.PublisherConfig{ConnConfig: amqpConn(connURL, u, "idem"), Exchange: cmp.Or(exchange, named), QueueOf: amqpQueueOf(prefix)})
	if err != nil {
		return nil, err
	}
	if err := p.Connect(ctx); err != nil {
		_ = p.Close()
		return nil, err
	}
	return p, nil
}

// amqpQueueOf returns the function that names a consumer's queue, as
// SubscribeConfig.Names does.
func amqpQueueOf(prefix string) func(string) string {
	return func(consumer string) string {
		_, q := SubscribeConfig{Consumer: consumer, Prefix: prefix}.Names()
		return q
	}
}

// inspectAMQP opens a RabbitMQ publisher that declares nothing, for its
// Inspect.
func inspectAMQP(ctx context.Context, rawURL, prefix string) (Inspector, error) {
	u, err := parseAMQPURL(rawURL)
	if err != nil {
		return nil, err
	}
	connURL, _, _ := amqpParams(rawURL, u)
	p, err := amqp.NewPublisher(amqp.PublisherConfig{ConnConfig: amqpConn(connURL, u, "idem status"), NoDeclare: true, QueueOf: amqpQueueOf(prefix)})
	if err != nil {
		return nil, err
	}
	if err := p.Connect(ctx); err != nil {
		_ = p.Close()
		return nil, err
	}
	return p, nil
}

// amqpPartitions reads a subscriber's partitions and partition query
// parameters (amqp.SubscriberConfig.Partitions and Partition): 0 when
// absent.
func amqpPartitions(rawURL string, u *url.URL) (partitions, partition int, err error) {
	q := u.Query()
	for _, p := range []struct {
		name string
		to   *int
	}{{"partitions", &partitions}, {"partition", &partition}} {
		v := q.Get(p.name)
		if v == "" {
			continue
		}
		if *p.to, err = strconv.Atoi(v); err != nil || *p.to < 0 {
			return 0, 0, fmt.Errorf("broker URL %s: %s=%q: want a number, 0 or more", broker.RedactURL(rawURL), p.name, v)
		}
	}
	return partitions, partition, nil
}

// partitionsAMQP reads the parameter partitions of a RabbitMQ URL.
func partitionsAMQP(rawURL string) (int, error) {
	u, err := parseAMQPURL(rawURL)
	if err != nil {
		return 0, err
	}
	partitions, _, err := amqpPartitions(rawURL, u)
	return partitions, err
}

// subscribeAMQP returns a subscriber of the queue <consumer>.events bound
// to names; queue_type=quorum declares a quorum queue (a queue keeps the
// type it was declared with); partitions=P&partition=k consumes partition
// k of P (the queue <consumer>.events.p<k>).
func subscribeAMQP(rawURL string, cfg SubscribeConfig, names []string, deliver broker.DeliverFunc) (broker.Subscriber, error) {
	u, err := parseAMQPURL(rawURL)
	if err != nil {
		return nil, err
	}
	exchange, queue := cfg.Names()
	connURL, urlExchange, queueType := amqpParams(rawURL, u)
	if queueType != "" && queueType != amqp.Classic && queueType != amqp.Quorum {
		return nil, fmt.Errorf("broker URL %s: queue_type=%q: want %q or %q", broker.RedactURL(rawURL), queueType, amqp.Classic, amqp.Quorum)
	}
	partitions, partition, err := amqpPartitions(rawURL, u)
	if err != nil {
		return nil, err
	}
	if !u.Query().Has("partition") {
		partition = cfg.Partition
	}
	cc := amqpConn(connURL, u, cfg.Consumer)
	cc.Logger = cfg.Logger
	return amqp.NewSubscriber(amqp.SubscriberConfig{
		ConnConfig: cc, Exchange: cmp.Or(urlExchange, exchange), Queue: queue, Bindings: names, QueueType: queueType,
		Workers: cfg.Workers, BatchSize: cfg.BatchSize, Partitions: partitions, Partition: partition,
	}, deliver)
}
