package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/nats"
	"github.com/idem-go/idem/broker/nats/embedded"
)

// natsURLHelp describes the transport's URLs (BrokerURLHelp).
const natsURLHelp = `nats://user:pass@host:4222 or tls://host:4222?ca=ca.pem&cert=c.pem&key=k.pem&creds=user.creds, a cluster: nats://host1:4222,host2:4222,host3:4222?replicas=3, embedded (a NATS server in the process: ?dir=, ?listen=, ?sync=interval); a partitioned stream: ?partitions=8 (a subscriber: &partition=3)`

// EmbeddedDirDefault is where an embedded NATS server keeps its data when the
// URL gives no dir.
const EmbeddedDirDefault = "idem-data/nats"

// natsURL rewrites "embedded" and "embedded?..." to nats://embedded....
func natsURL(rawURL string) string {
	if rawURL == "embedded" || strings.HasPrefix(rawURL, "embedded?") {
		return "nats://" + rawURL
	}
	return rawURL
}

// natsStream returns the stream of u's parameters stream, prefix,
// partitions and replicas, or, when absent and prefix is set, <PREFIX>_EVENTS and
// <prefix>.events.
func natsStream(u *url.URL, prefix string) (nats.StreamConfig, error) {
	q := u.Query()
	s := nats.StreamConfig{Name: q.Get("stream"), SubjectPrefix: q.Get("prefix")}
	if v := q.Get("partitions"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > nats.PartitionsMax {
			return s, fmt.Errorf("broker URL %s: partitions=%q: want a number from 0 (unpartitioned) to %d", broker.RedactURL(u.String()), v, nats.PartitionsMax)
		}
		s.Partitions = n
	}
	if v := q.Get("replicas"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return s, fmt.Errorf("broker URL %s: replicas=%q: want the number of servers of the cluster that keep the stream (1 to 5; 3 survives the loss of one)", broker.RedactURL(u.String()), v)
		}
		s.Replicas = n
	}
	if prefix != "" {
		if s.Name == "" {
			s.Name = strings.ToUpper(strings.NewReplacer(".", "_", "*", "_", ">", "_", " ", "_").Replace(prefix)) + "_" + nats.StreamDefault
		}
		if s.SubjectPrefix == "" {
			s.SubjectPrefix = prefix + "." + nats.SubjectPrefixDefault
		}
	}
	return s, nil
}

// natsPartition returns u's parameter partition (the partition a subscriber
// reads), 0 when absent.
func natsPartition(u *url.URL) (int, error) {
	v := u.Query().Get("partition")
	if v == "" {
		return 0, nil
	}
	k, err := strconv.Atoi(v)
	if err != nil || k < 0 {
		return 0, fmt.Errorf("broker URL %s: partition=%q: want a number from 0 to partitions-1", broker.RedactURL(u.String()), v)
	}
	return k, nil
}

// natsConn returns the connection settings for u: its URL without idem's
// parameters, or a connection to an embedded server (nats://embedded) shared
// by everything the process opens on the same dir, and a release function.
// An embedded server logs its warnings and errors to log.
func natsConn(ctx context.Context, u *url.URL, name string, log *slog.Logger) (nats.ConnConfig, func() error, error) {
	q := u.Query()
	if u.Host != "embedded" {
		var opts []natsgo.Option
		if ca := q.Get("ca"); ca != "" {
			opts = append(opts, natsgo.RootCAs(ca))
		}
		if cert, key := q.Get("cert"), q.Get("key"); cert != "" || key != "" {
			if cert == "" || key == "" {
				return nats.ConnConfig{}, nil, fmt.Errorf("broker URL %s: cert and key go together", broker.RedactURL(u.String()))
			}
			opts = append(opts, natsgo.ClientCert(cert, key))
		}
		if creds := q.Get("creds"); creds != "" {
			opts = append(opts, natsgo.UserCredentials(creds))
		}
		for _, k := range []string{"stream", "prefix", "replicas", "partitions", "partition", "ack_wait", "ca", "cert", "key", "creds"} {
			q.Del(k)
		}
		v := *u
		v.RawQuery = q.Encode()
		return nats.ConnConfig{URL: v.String(), Name: name, Options: opts}, func() error { return nil }, nil
	}
	var syncAlways bool
	switch q.Get("sync") {
	case "", "always":
		syncAlways = true
	case "interval":
	default:
		return nats.ConnConfig{}, nil, fmt.Errorf("broker URL %s: sync=%q: want always (the default: each message is on disk before it is acknowledged) or interval (faster; a machine crash can lose the last two minutes)",
			broker.RedactURL(u.String()), q.Get("sync"))
	}
	srv, release, err := acquireEmbedded(ctx, q.Get("dir"), embedded.Config{Listen: q.Get("listen"), SyncAlways: syncAlways, Logger: log})
	if err != nil {
		return nats.ConnConfig{}, nil, err
	}
	nc, err := srv.Connect(natsgo.Name(name))
	if err != nil {
		return nats.ConnConfig{}, nil, errors.Join(err, release())
	}
	return nats.ConnConfig{Conn: nc}, func() error { nc.Close(); return release() }, nil
}

// publishNATS opens a JetStream publisher. nats://host:4222 (tls:// for
// TLS; ca, cert, key and creds parameters name the files of a private CA, a
// client certificate and a credentials file; user:pass@ in the URL) connects
// to a server; the servers of a cluster are listed comma-separated,
// nats://host1:4222,host2:4222,host3:4222 (the client connects to one and
// moves to another when it fails), with replicas=3 to keep the stream on
// three servers (a new stream is created so, an existing one changed to it;
// without replicas, an existing stream keeps its count); nats://embedded (or just "embedded") starts one in the
// process, with JetStream data in the dir parameter (default
// idem-data/nats), listening on the listen parameter if set (for example
// 127.0.0.1:4222), syncing each message to disk before acknowledging it
// unless sync=interval, and logging to slog.Default(); the last user to
// close stops it. The parameters stream and prefix override the stream name
// (EVENTS) and subject prefix (events); partitions=P publishes to a stream
// of P partitions (nats.StreamConfig.Partitions).
func publishNATS(ctx context.Context, rawURL, prefix string) (Publisher, error) {
	u, err := parseURL(natsURL(rawURL))
	if err != nil {
		return nil, err
	}
	stream, err := natsStream(u, prefix)
	if err != nil {
		return nil, err
	}
	cc, release, err := natsConn(ctx, u, "idem", slog.Default())
	if err != nil {
		return nil, err
	}
	p, err := nats.NewPublisher(ctx, nats.PublisherConfig{ConnConfig: cc, Stream: stream})
	if err != nil {
		return nil, errors.Join(err, release())
	}
	return &natsPublisher{Publisher: p, release: release}, nil
}

// inspectNATS opens a JetStream publisher that leaves the stream as it is,
// for its Inspect.
func inspectNATS(ctx context.Context, rawURL, prefix string) (Inspector, error) {
	u, err := parseURL(natsURL(rawURL))
	if err != nil {
		return nil, err
	}
	if u.Host == "embedded" {
		// A second server on the data of the process that runs it would
		// read, and write, files that process owns.
		return nil, fmt.Errorf("broker URL %s: an embedded NATS server is only reachable from its own process; start it with ?listen=127.0.0.1:4222 and give nats://127.0.0.1:4222", broker.RedactURL(rawURL))
	}
	stream, err := natsStream(u, prefix)
	if err != nil {
		return nil, err
	}
	cc, release, err := natsConn(ctx, u, "idem status", slog.Default())
	if err != nil {
		return nil, err
	}
	// Without partitions=P in the URL, the stream's own count (its
	// metadata) says which durable consumers to report.
	p, err := nats.NewPublisher(ctx, nats.PublisherConfig{ConnConfig: cc, Stream: stream, NoDeclare: true,
		PartitionsFromStream: !u.Query().Has("partitions")})
	if err != nil {
		return nil, errors.Join(err, release())
	}
	return &natsPublisher{Publisher: p, release: release}, nil
}

// natsPublisher is a publisher with what it must release on Close.
type natsPublisher struct {
	*nats.Publisher
	release func() error
}

// Close closes the publisher and releases its connection.
func (p *natsPublisher) Close() error {
	return errors.Join(p.Publisher.Close(), p.release())
}

// partitionsNATS reads the parameter partitions of a NATS URL.
func partitionsNATS(rawURL string) (int, error) {
	u, err := parseURL(natsURL(rawURL))
	if err != nil {
		return 0, err
	}
	s, err := natsStream(u, "")
	return s.Partitions, err
}

// subscribeNATS returns a JetStream subscriber with a durable consumer named
// cfg.Consumer, bound to names.
// The URL parameter ack_wait (a duration, such as 5s) sets how long
// JetStream waits for an acknowledgement before delivering a message again
// (default nats.AckWaitDefault); partitions=P&partition=k reads partition k
// of a stream of P partitions (durable consumer <consumer>-p<k>).
func subscribeNATS(rawURL string, cfg SubscribeConfig, names []string, deliver broker.DeliverFunc) (broker.Subscriber, error) {
	u, err := parseURL(natsURL(rawURL))
	if err != nil {
		return nil, err
	}
	stream, err := natsStream(u, cfg.Prefix)
	if err != nil {
		return nil, err
	}
	partition, err := natsPartition(u)
	if err != nil {
		return nil, err
	}
	if !u.Query().Has("partition") {
		partition = cfg.Partition
	}
	var ackWait time.Duration
	if v := u.Query().Get("ack_wait"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second {
			return nil, fmt.Errorf("broker URL %s: ack_wait=%q: want a duration of at least 1s", broker.RedactURL(u.String()), v)
		}
		ackWait = d
	}
	return &natsSubscriber{u: u, cfg: cfg, names: names, deliver: withAckFault(deliver), ackWait: ackWait, stream: stream, partition: partition}, nil
}

// natsSubscriber opens its connection (and the embedded server) on Start.
type natsSubscriber struct {
	u       *url.URL
	cfg     SubscribeConfig
	names   []string
	deliver broker.DeliverFunc
	ackWait time.Duration
	// stream and partition are the URL's stream and partition.
	stream    nats.StreamConfig
	partition int

	sub     *nats.Subscriber
	release func() error
}

func (s *natsSubscriber) Start(ctx context.Context) error {
	cc, release, err := natsConn(ctx, s.u, s.cfg.Consumer, s.cfg.Logger)
	if err != nil {
		return err
	}
	cc.Logger = s.cfg.Logger
	sub, err := nats.NewSubscriber(nats.SubscriberConfig{
		ConnConfig: cc, Stream: s.stream, Consumer: s.cfg.Consumer, Bindings: s.names,
		Workers: s.cfg.Workers, BatchSize: s.cfg.BatchSize, AckWait: s.ackWait, Partition: s.partition,
	}, s.deliver)
	if err == nil {
		err = sub.Start(ctx)
	}
	if err != nil {
		return errors.Join(err, release())
	}
	s.sub, s.release = sub, release
	return nil
}

func (s *natsSubscriber) Stop(ctx context.Context) error {
	if s.sub == nil {
		return nil
	}
	err := s.sub.Stop(ctx)
	if s.release != nil {
		err = errors.Join(err, s.release())
		s.release = nil
	}
	return err
}

// Embedded servers of this process, by absolute directory, with their
// number of users.
var (
	embeddedMu      sync.Mutex
	embeddedServers = map[string]*sharedServer{}
)

type sharedServer struct {
	srv   *embedded.Server
	users int
}

// acquireEmbedded returns the process's embedded server on dir, starting it
// if needed, and a function that stops it after its last user released it.
func acquireEmbedded(ctx context.Context, dir string, cfg embedded.Config) (*embedded.Server, func() error, error) {
	if dir == "" {
		dir = EmbeddedDirDefault
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, nil, err
	}
	embeddedMu.Lock()
	defer embeddedMu.Unlock()
	s := embeddedServers[abs]
	if s == nil {
		cfg.Dir = abs
		srv, err := embedded.Start(ctx, cfg)
		if err != nil {
			return nil, nil, err
		}
		s = &sharedServer{srv: srv}
		embeddedServers[abs] = s
	}
	s.users++
	var once sync.Once
	release := func() error {
		var err error
		once.Do(func() {
			embeddedMu.Lock()
			defer embeddedMu.Unlock()
			s.users--
			if s.users == 0 {
				delete(embeddedServers, abs)
				err = s.srv.Shutdown(context.Background())
			}
		})
		return err
	}
	return s.srv, release, nil
}
