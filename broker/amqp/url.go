package amqp

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/internal/tlsfiles"
)

// URLConfig is what a RabbitMQ URL says (ParseURL): how to connect, and
// idem's own parameters. PublisherConfig and SubscriberConfig turn it into
// the configuration of a publisher or a subscriber.
type URLConfig struct {
	// ConnConfig has the URL without idem's parameters: its hosts,
	// credentials and vhost, and the parameters amqp091-go reads itself
	// (heartbeat, and the TLS files cacertfile, certfile, keyfile and
	// server_name_indication of amqps:// URLs: see ParseURL). When the URL has no
	// credentials, Username and Password are $IDEM_AMQP_USERNAME and
	// $IDEM_AMQP_PASSWORD.
	ConnConfig
	// Exchange is the parameter exchange, the topic exchange events are
	// published to; empty when absent (ExchangeDefault).
	Exchange string
	// QueueType is the parameter queue_type, classic or quorum, the type
	// a subscriber declares its queue with; empty when absent (Classic).
	QueueType QueueType
	// Partitions is the parameter partitions: a subscriber's queue is
	// split in that many partition queues (SubscriberConfig.Partitions).
	// 0 when absent.
	Partitions int
	// Partition is the parameter partition, the partition a subscriber
	// consumes (SubscriberConfig.Partition); PartitionSet says whether the
	// URL has it, so that a caller running one subscriber per partition
	// can tell a URL that names one.
	Partition    int
	PartitionSet bool
	// CloudEvents is set by the parameters cloudevents and
	// cloudevents_source (broker.CloudEventsFromURL): a publisher publishes
	// CloudEvents. nil when absent.
	CloudEvents *idem.CloudEvents
}

// ParseURL parses a RabbitMQ URL, amqp://user:pass@host:5672/vhost or
// amqps://... for TLS, which may list the nodes of a cluster
// (amqp://user:pass@h1:5672,h2:5672,h3:5672/vhost; see ConnConfig.URL).
// Besides the parameters amqp091-go reads, it takes idem's own:
//
//   - exchange=NAME: the topic exchange (default "events");
//   - queue_type=classic|quorum: the type of a subscriber's queue (a queue
//     keeps the type it was declared with);
//   - partitions=P and partition=K: a subscriber consumes partition K of
//     its queue split in P (the queue <queue>.p<K>);
//   - cloudevents=binary|structured and cloudevents_source=URI: a
//     publisher publishes CloudEvents (PublisherConfig.CloudEvents).
//
// TLS: an amqps:// URL verifies the server's certificate against the
// system's roots, or the CA certificates (PEM) of cacertfile=FILE, and
// presents the client certificate of certfile=FILE and keyfile=FILE, which
// go together (RabbitMQ's ssl_options.verify = verify_peer with
// fail_if_no_peer_cert = true refuses a client without one). The name
// checked is the host's, or server_name_indication=NAME. ParseURL checks
// that the files can be read and hold a certificate and a matching key,
// and refuses them on an amqp:// URL, which is not encrypted; amqp091-go
// reads them again at each connection, so that a renewed certificate is
// taken on the next reconnection.
//
// A URL without credentials takes them from $IDEM_AMQP_USERNAME and
// $IDEM_AMQP_PASSWORD. Errors name the parameter and never contain the
// password.
func ParseURL(rawURL string) (URLConfig, error) {
	urls, err := SplitURL(rawURL)
	if err != nil {
		return URLConfig{}, fmt.Errorf("idem: amqp: URL %w", err)
	}
	// The hosts share the query: the first one's is everyone's.
	u, err := url.Parse(urls[0])
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL and its password
		}
		return URLConfig{}, fmt.Errorf("idem: amqp: URL %s: %w", broker.RedactURL(rawURL), err)
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("idem: amqp: URL %s: %s", broker.RedactURL(rawURL), fmt.Sprintf(format, args...))
	}
	q := u.Query()
	c := URLConfig{Exchange: q.Get("exchange"), QueueType: QueueType(q.Get("queue_type"))}
	if c.QueueType != "" && c.QueueType != Classic && c.QueueType != Quorum {
		return URLConfig{}, bad("queue_type=%q: want %q or %q", c.QueueType, Classic, Quorum)
	}
	for _, p := range []struct {
		name string
		to   *int
	}{{"partitions", &c.Partitions}, {"partition", &c.Partition}} {
		v := q.Get(p.name)
		if v == "" {
			continue
		}
		if *p.to, err = strconv.Atoi(v); err != nil || *p.to < 0 {
			return URLConfig{}, bad("%s=%q: want a number, 0 or more", p.name, v)
		}
	}
	if err := checkTLSFiles(u); err != nil {
		return URLConfig{}, bad("%v", err)
	}
	c.PartitionSet = q.Has("partition")
	if c.CloudEvents, err = broker.CloudEventsFromURL(q); err != nil {
		return URLConfig{}, bad("%v", err)
	}
	for _, k := range append([]string{"exchange", "queue_type", "partitions", "partition"}, broker.CloudEventsParams...) {
		q.Del(k)
	}
	// The hosts of rawURL are kept: only the query changes.
	connURL, _, _ := strings.Cut(rawURL, "#")
	connURL, _, _ = strings.Cut(connURL, "?")
	if len(q) > 0 {
		connURL += "?" + q.Encode()
	}
	c.URL = connURL
	if u.User == nil {
		c.Username, c.Password = os.Getenv("IDEM_AMQP_USERNAME"), os.Getenv("IDEM_AMQP_PASSWORD")
	}
	return c, nil
}

// checkTLSFiles checks the TLS parameters of u that amqp091-go reads
// (cacertfile, certfile and keyfile; see ParseURL), which it would
// otherwise ignore or half use in silence.
func checkTLSFiles(u *url.URL) error {
	q := u.Query()
	f := tlsfiles.Files{CA: q.Get("cacertfile"), Cert: q.Get("certfile"), Key: q.Get("keyfile"),
		CAParam: "cacertfile", CertParam: "certfile", KeyParam: "keyfile"}
	if f.Empty() {
		return nil
	}
	if !strings.EqualFold(u.Scheme, "amqps") {
		return errors.New("cacertfile, certfile and keyfile are for amqps:// URLs: an amqp:// connection is not encrypted")
	}
	_, err := f.Config()
	return err
}

// PublisherConfig returns the configuration of a publisher to the URL's
// broker and exchange, publishing CloudEvents if the URL says so.
func (c URLConfig) PublisherConfig() PublisherConfig {
	return PublisherConfig{ConnConfig: c.ConnConfig, Exchange: c.Exchange, CloudEvents: c.CloudEvents}
}

// SubscriberConfig returns the configuration of a subscriber of the URL's
// broker, exchange, queue type and partitions; set its Queue and Bindings.
func (c URLConfig) SubscriberConfig() SubscriberConfig {
	return SubscriberConfig{ConnConfig: c.ConnConfig, Exchange: c.Exchange, QueueType: c.QueueType,
		Partitions: c.Partitions, Partition: c.Partition}
}
