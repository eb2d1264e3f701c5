package nats

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
)

// URLConfig is what a NATS URL says (ParseURL): the servers and how to
// authenticate, the stream, and a subscriber's settings. PublisherConfig and
// SubscriberConfig turn it into the configuration of a publisher or a
// subscriber.
type URLConfig struct {
	// ConnConfig has the URL of the server, or of the servers of a
	// cluster, without idem's parameters, and in Options the files of the
	// parameters ca (nats.RootCAs), cert and key (nats.ClientCert) and
	// creds (nats.UserCredentials). Empty for an embedded server (see
	// Embedded).
	ConnConfig
	// Stream has the parameters stream (Name), prefix (SubjectPrefix),
	// partitions (Partitions) and replicas (Replicas), zero when absent
	// (the defaults of StreamConfig).
	Stream StreamConfig
	// PartitionsSet says whether the URL has the parameter partitions:
	// without it, a tool that inspects the stream may take the stream's
	// own count (PublisherConfig.PartitionsFromStream).
	PartitionsSet bool
	// Partition is the parameter partition, the partition a subscriber
	// reads (SubscriberConfig.Partition); PartitionSet says whether the
	// URL has it, so that a caller running one subscriber per partition
	// can tell a URL that names one.
	Partition    int
	PartitionSet bool
	// AckWait is the parameter ack_wait, how long JetStream waits for a
	// subscriber's acknowledgement (SubscriberConfig.AckWait); 0 when
	// absent.
	AckWait time.Duration
	// Embedded is set for the URL "embedded" (or nats://embedded): a NATS
	// server to run in the process, with package broker/nats/embedded,
	// rather than one to connect to. Connect to it and set ConnConfig.Conn.
	Embedded *EmbeddedServer
	// CloudEvents is set by the parameters cloudevents and
	// cloudevents_source (broker.CloudEventsFromURL): a publisher publishes
	// CloudEvents. nil when absent.
	CloudEvents *idem.CloudEvents
}

// EmbeddedServer is the server an embedded URL asks to run in the process
// (the fields of embedded.Config they set).
type EmbeddedServer struct {
	// Dir is the parameter dir, the directory of the server's data; empty
	// when absent (the caller chooses).
	Dir string
	// Listen is the parameter listen, host:port of the server's client
	// listener, for example 127.0.0.1:4222; empty: in-process connections
	// only.
	Listen string
	// SyncAlways is true unless the parameter sync is interval: each
	// message is then on disk before it is acknowledged.
	SyncAlways bool
}

// Parameters of a NATS URL that are idem's, not the server's.
var urlParams = []string{"stream", "prefix", "replicas", "partitions", "partition", "ack_wait", "ca", "cert", "key", "creds",
	"cloudevents", "cloudevents_source"}

// ParseURL parses a NATS URL:
//
//   - nats://user:pass@host:4222, or tls://host:4222 for TLS, connects to
//     a server; the servers of a cluster are listed comma-separated,
//     nats://host1:4222,host2:4222,host3:4222 (the client connects to one
//     and moves to another when it fails). The parameters ca, cert, key
//     and creds name the files of a private CA, a client certificate and
//     its key, and a credentials file.
//   - embedded (or nats://embedded) is a server in the process (Embedded),
//     with its data in the directory of the parameter dir, listening on
//     the parameter listen if set, and syncing each message to disk before
//     acknowledging it unless sync=interval.
//
// Both take the parameters stream and prefix (the stream name, default
// EVENTS, and subject prefix, default events), replicas=N (the servers of
// a cluster that keep the stream), partitions=P (a stream of P
// partitions), and, for a subscriber, partition=K (the partition it reads)
// and ack_wait=DURATION (at least 1s), and, for a publisher,
// cloudevents=binary|structured and cloudevents_source=URI (publish
// CloudEvents, PublisherConfig.CloudEvents). Errors name the parameter and
// never contain the password.
func ParseURL(rawURL string) (URLConfig, error) {
	if rawURL == "embedded" || strings.HasPrefix(rawURL, "embedded?") {
		rawURL = "nats://" + rawURL
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL and its password
		}
		return URLConfig{}, fmt.Errorf("idem: nats: URL %s: %w", broker.RedactURL(rawURL), err)
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("idem: nats: URL %s: %s", broker.RedactURL(u.String()), fmt.Sprintf(format, args...))
	}
	q := u.Query()
	var c URLConfig
	c.Stream = StreamConfig{Name: q.Get("stream"), SubjectPrefix: q.Get("prefix")}
	if v := q.Get("partitions"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > PartitionsMax {
			return URLConfig{}, bad("partitions=%q: want a number from 0 (unpartitioned) to %d", v, PartitionsMax)
		}
		c.Stream.Partitions = n
	}
	c.PartitionsSet = q.Has("partitions")
	if c.CloudEvents, err = broker.CloudEventsFromURL(q); err != nil {
		return URLConfig{}, bad("%v", err)
	}
	if v := q.Get("replicas"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return URLConfig{}, bad("replicas=%q: want the number of servers of the cluster that keep the stream (1 to 5; 3 survives the loss of one)", v)
		}
		c.Stream.Replicas = n
	}
	if v := q.Get("partition"); v != "" {
		k, err := strconv.Atoi(v)
		if err != nil || k < 0 {
			return URLConfig{}, bad("partition=%q: want a number from 0 to partitions-1", v)
		}
		c.Partition = k
	}
	c.PartitionSet = q.Has("partition")
	if v := q.Get("ack_wait"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second {
			return URLConfig{}, bad("ack_wait=%q: want a duration of at least 1s", v)
		}
		c.AckWait = d
	}
	if u.Host == "embedded" {
		e := &EmbeddedServer{Dir: q.Get("dir"), Listen: q.Get("listen")}
		switch q.Get("sync") {
		case "", "always":
			e.SyncAlways = true
		case "interval":
		default:
			return URLConfig{}, bad("sync=%q: want always (the default: each message is on disk before it is acknowledged) or interval (faster; a machine crash can lose the last two minutes)", q.Get("sync"))
		}
		c.Embedded = e
		return c, nil
	}
	if ca := q.Get("ca"); ca != "" {
		c.Options = append(c.Options, nats.RootCAs(ca))
	}
	if cert, key := q.Get("cert"), q.Get("key"); cert != "" || key != "" {
		if cert == "" || key == "" {
			return URLConfig{}, bad("cert and key go together")
		}
		c.Options = append(c.Options, nats.ClientCert(cert, key))
	}
	if creds := q.Get("creds"); creds != "" {
		c.Options = append(c.Options, nats.UserCredentials(creds))
	}
	for _, k := range urlParams {
		q.Del(k)
	}
	v := *u
	v.RawQuery = q.Encode()
	c.URL = v.String()
	return c, nil
}

// PublisherConfig returns the configuration of a publisher to the URL's
// servers and stream. For an embedded server (Embedded), set its
// ConnConfig.Conn.
func (c URLConfig) PublisherConfig() PublisherConfig {
	return PublisherConfig{ConnConfig: c.ConnConfig, Stream: c.Stream, CloudEvents: c.CloudEvents}
}

// SubscriberConfig returns the configuration of a subscriber of the URL's
// servers, stream and partition, with its ack_wait; set its Consumer and
// Bindings. For an embedded server (Embedded), set its ConnConfig.Conn.
func (c URLConfig) SubscriberConfig() SubscriberConfig {
	return SubscriberConfig{ConnConfig: c.ConnConfig, Stream: c.Stream, Partition: c.Partition, AckWait: c.AckWait}
}
