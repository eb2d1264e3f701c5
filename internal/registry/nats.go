package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/nats"
	"github.com/idem-go/idem/broker/nats/embedded"
	"github.com/idem-go/idem/internal/startstop"
)

// natsURLHelp describes the transport's URLs (BrokerURLHelp).
const natsURLHelp = `nats://user:pass@host:4222 or tls://host:4222?ca=ca.pem&cert=c.pem&key=k.pem&creds=user.creds, a cluster: nats://host1:4222,host2:4222,host3:4222?replicas=3, embedded (a NATS server in the process: ?dir=, ?listen=, ?sync=interval); a partitioned stream: ?partitions=8 (a subscriber: &partition=3)`

// EmbeddedDirDefault is where an embedded NATS server keeps its data when the
// URL gives no dir.
const EmbeddedDirDefault = "idem-data/nats"

// natsStream returns the stream of the URL's configuration, or, when its
// name and subject prefix are absent and prefix is set, <PREFIX>_EVENTS and
// <prefix>.events.
func natsStream(uc nats.URLConfig, prefix string) nats.StreamConfig {
	s := uc.Stream
	if prefix != "" {
		if s.Name == "" {
			s.Name = strings.ToUpper(strings.NewReplacer(".", "_", "*", "_", ">", "_", " ", "_").Replace(prefix)) + "_" + nats.StreamDefault
		}
		if s.SubjectPrefix == "" {
			s.SubjectPrefix = prefix + "." + nats.SubjectPrefixDefault
		}
	}
	return s
}

// natsConn returns the connection settings of the URL's configuration, or
// a connection to an embedded server shared by everything the process opens
// on the same dir, and a release function. An embedded server logs its
// warnings and errors to log.
func natsConn(ctx context.Context, uc nats.URLConfig, name string, log *slog.Logger) (nats.ConnConfig, func() error, error) {
	if uc.Embedded == nil {
		cc := uc.ConnConfig
		cc.Name = name
		return cc, func() error { return nil }, nil
	}
	e := uc.Embedded
	srv, release, err := acquireEmbedded(ctx, e.Dir, embedded.Config{Listen: e.Listen, SyncAlways: e.SyncAlways, Logger: log})
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
	uc, err := nats.ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	cc, release, err := natsConn(ctx, uc, "idem", slog.Default())
	if err != nil {
		return nil, err
	}
	p, err := nats.NewPublisher(ctx, nats.PublisherConfig{ConnConfig: cc, Stream: natsStream(uc, prefix), CloudEvents: uc.CloudEvents})
	if err != nil {
		return nil, errors.Join(err, release())
	}
	return &natsPublisher{Publisher: p, release: release}, nil
}

// inspectNATS opens a JetStream publisher that leaves the stream as it is,
// for its Inspect.
func inspectNATS(ctx context.Context, rawURL, prefix string) (Inspector, error) {
	uc, err := nats.ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	if uc.Embedded != nil {
		// A second server on the data of the process that runs it would
		// read, and write, files that process owns.
		return nil, fmt.Errorf("broker URL %s: an embedded NATS server is only reachable from its own process; start it with ?listen=127.0.0.1:4222 and give nats://127.0.0.1:4222", broker.RedactURL(rawURL))
	}
	cc, release, err := natsConn(ctx, uc, "idem status", slog.Default())
	if err != nil {
		return nil, err
	}
	// Without partitions=P in the URL, the stream's own count (its
	// metadata) says which durable consumers to report.
	p, err := nats.NewPublisher(ctx, nats.PublisherConfig{ConnConfig: cc, Stream: natsStream(uc, prefix), NoDeclare: true,
		PartitionsFromStream: !uc.PartitionsSet})
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
	uc, err := nats.ParseURL(rawURL)
	return uc.Stream.Partitions, err
}

// subscribeNATS returns a JetStream subscriber with a durable consumer named
// cfg.Consumer, bound to names.
// The URL parameter ack_wait (a duration, such as 5s) sets how long
// JetStream waits for an acknowledgement before delivering a message again
// (default nats.AckWaitDefault); partitions=P&partition=k reads partition k
// of a stream of P partitions (durable consumer <consumer>-p<k>).
func subscribeNATS(rawURL string, cfg SubscribeConfig, names []string, deliver broker.DeliverFunc) (broker.Subscriber, error) {
	uc, err := nats.ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	partition := uc.Partition
	if !uc.PartitionSet {
		partition = cfg.Partition
	}
	return &natsSubscriber{u: uc, cfg: cfg, names: names, deliver: withAckFault(deliver), ackWait: uc.AckWait, stream: natsStream(uc, cfg.Prefix), partition: partition}, nil
}

// natsSubscriber opens its connection (and the embedded server) on Start.
type natsSubscriber struct {
	u       nats.URLConfig
	cfg     SubscribeConfig
	names   []string
	deliver broker.DeliverFunc
	ackWait time.Duration
	// stream and partition are the URL's stream and partition.
	stream    nats.StreamConfig
	partition int

	// base is the lifecycle of the subscriber and its connection: the
	// work ends once the subscriber has stopped and the connection (or
	// the embedded server) is released.
	base    startstop.Base
	mu      sync.Mutex
	stopErr error // the subscriber's stop and the release's, once done
}

// Start opens the connection (starting the embedded server if the URL says
// so) and starts the subscriber. A Stop during Start interrupts it.
func (s *natsSubscriber) Start(ctx context.Context) error {
	if err := s.base.Starting(); err != nil {
		return fmt.Errorf("idem: nats subscriber: %w", err)
	}
	ctx, cancel := s.base.StartContext(ctx)
	defer cancel()
	cc, release, err := natsConn(ctx, s.u, s.cfg.Consumer, s.cfg.Logger)
	if err != nil {
		s.base.StartFailed()
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
		err = errors.Join(err, release())
		s.base.StartFailed()
		return err
	}
	go func() {
		var err error
		select {
		case <-s.base.Stopping():
			// Abandons the subscriber's work when Stop runs out of time.
			err = sub.Stop(s.base.WorkContext())
		case <-sub.Done():
		}
		<-sub.Done()
		err = errors.Join(err, release())
		s.mu.Lock()
		s.stopErr = err
		s.mu.Unlock()
		s.base.Finished()
	}()
	s.base.Running() // a Stop during the start-up is seen by the goroutine
	return nil
}

// Stop stops the subscriber and releases its connection, and returns once
// both have ended, with their errors. When ctx ends first, the subscriber's
// work is abandoned and Stop returns ctx's error at once; Done is closed
// once everything has ended.
func (s *natsSubscriber) Stop(ctx context.Context) error {
	if err := s.base.Stop(ctx, nil, nil); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopErr
}

// Done is closed once the subscriber has stopped and its connection is
// released.
func (s *natsSubscriber) Done() <-chan struct{} { return s.base.Done() }

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
