package nats_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/nats"
	"github.com/idem-go/idem/internal/testsvc"
)

func ackAll(_ context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
	disps := make([]broker.Disposition, len(ds))
	for i := range disps {
		disps[i].Action = broker.Ack
	}
	return disps, make([]error, len(ds))
}

// TestLeaseRenewalReplyLost: a renewal whose write succeeded but whose
// reply was lost (a timeout) moved the lease's key to a revision the
// subscriber does not know; its next renewal's compare-and-set fails, yet
// the key holds the subscriber's own value: it still owns the durable
// consumer and must not stand by ("another process took the lease", with
// no other process). A key holding another value is lost.
func TestLeaseRenewalReplyLost(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	n := newNames()
	// A long TTL: the subscriber's own renewals (every 10s) stay out of
	// the way.
	sub, err := nats.NewSubscriber(nats.SubscriberConfig{
		ConnConfig: nats.ConnConfig{URL: srv.url()}, Stream: n.stream, Consumer: "stock", OwnerTTL: 30 * time.Second,
	}, ackAll)
	if err != nil {
		t.Fatal(err)
	}
	testsvc.Start(t, sub)
	if !sub.Active() {
		t.Fatal("the only subscriber is not active")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 2 {
		if err := nats.RenewBehindItsBack(ctx, sub); err != nil {
			t.Fatal(err)
		}
		held, err := nats.RenewLease(ctx, sub)
		if err != nil || !held {
			t.Fatalf("renewal #%d after a renewal whose reply was lost: held %v, %v; want held (the key holds this subscriber's value)", i+1, held, err)
		}
		if !sub.Active() {
			t.Fatal("the subscriber stood by")
		}
	}
	if err := nats.TakeLeaseBehindItsBack(ctx, sub); err != nil {
		t.Fatal(err)
	}
	if held, err := nats.RenewLease(ctx, sub); err != nil || held {
		t.Fatalf("renewal after another process took the lease: held %v, %v; want lost", held, err)
	}
}

// TestOwnerTTLMismatch: every subscriber of a stream shares its owners
// bucket and its TTL. A subscriber configured with another OwnerTTL than
// the bucket's refuses to start (ErrOwnerTTL) instead of rewriting the
// bucket's TTL under the running ones (which renew at their own pace);
// OwnerTTL 0 takes the bucket's.
func TestOwnerTTLMismatch(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	n := newNames()
	newSub := func(ttl time.Duration) *nats.Subscriber {
		sub, err := nats.NewSubscriber(nats.SubscriberConfig{
			ConnConfig: nats.ConnConfig{URL: srv.url()}, Stream: n.stream, Consumer: "stock", OwnerTTL: ttl, StandbyPoll: 50 * time.Millisecond,
		}, ackAll)
		if err != nil {
			t.Fatal(err)
		}
		return sub
	}
	first := newSub(3 * time.Second)
	testsvc.Start(t, first)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	other := newSub(4 * time.Second)
	err := other.Start(ctx)
	if err == nil {
		_ = other.Stop(ctx)
	}
	if !errors.Is(err, nats.ErrOwnerTTL) {
		t.Errorf("a subscriber with OwnerTTL 4s on a bucket of 3s: %v, want ErrOwnerTTL", err)
	} else {
		t.Logf("refused: %v", err)
	}
	dflt := newSub(0)
	testsvc.Start(t, dflt)
	if got := nats.LeaseTTL(dflt); got != 3*time.Second {
		t.Errorf("a subscriber with OwnerTTL 0 runs its lease with a TTL of %v, want the bucket's 3s", got)
	}
	kv, err := jsOf(t, srv.url()).KeyValue(ctx, nats.OwnersBucket(n.stream.Name))
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.TTL() != 3*time.Second {
		t.Errorf("bucket TTL %v, want 3s (the first subscriber's)", st.TTL())
	}
}

// jsOf returns a JetStream context on a connection of its own to url.
func jsOf(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, err := natsgo.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// TestDefaultPings: a connection idem dials PINGs its server every 10s
// and gives it up after 2 unanswered (a frozen server holds it 30s at
// most, not nats.go's 6 minutes); Options override both.
func TestDefaultPings(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	n := newNames()
	pub := newPublisher(t, srv.url(), n.stream)
	if o := pub.Conn().Opts; o.PingInterval != nats.PingIntervalDefault || o.MaxPingsOut != nats.MaxPingsOutstandingDefault ||
		nats.PingIntervalDefault != 10*time.Second || nats.MaxPingsOutstandingDefault != 2 {
		t.Errorf("PING every %v, %d outstanding; want 10s and 2", o.PingInterval, o.MaxPingsOut)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := nats.NewPublisher(ctx, nats.PublisherConfig{ConnConfig: nats.ConnConfig{URL: srv.url(),
		Options: []natsgo.Option{natsgo.PingInterval(time.Second), natsgo.MaxPingsOutstanding(5)}}, Stream: n.stream})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Close() }()
	if o := p.Conn().Opts; o.PingInterval != time.Second || o.MaxPingsOut != 5 {
		t.Errorf("with Options: PING every %v, %d outstanding; want 1s and 5", o.PingInterval, o.MaxPingsOut)
	}
}

// TestInspectPartitionsFromStream: a publisher with PartitionsFromStream
// (what "idem status" opens when its URL gives no partitions=P) inspects a
// partitioned stream through each partition's durable consumer, where one
// configured unpartitioned fails with ErrPartitions.
func TestInspectPartitionsFromStream(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	n := newNames()
	three := n.stream
	three.Partitions = 3
	newPublisher(t, srv.url(), three)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for k := range 3 {
		cfg := nats.SubscriberConfig{Stream: three, Consumer: "stock", Partition: k}
		if _, err := jsOf(t, srv.url()).CreateOrUpdateConsumer(ctx, three.Name, cfg.ConsumerConfig()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := nats.NewPublisher(ctx, nats.PublisherConfig{ConnConfig: nats.ConnConfig{URL: srv.url()}, Stream: n.stream, NoDeclare: true}); !errors.Is(err, nats.ErrPartitions) {
		t.Errorf("unpartitioned publisher on a stream of 3 partitions: %v, want ErrPartitions", err)
	}
	p, err := nats.NewPublisher(ctx, nats.PublisherConfig{ConnConfig: nats.ConnConfig{URL: srv.url()}, Stream: n.stream, NoDeclare: true, PartitionsFromStream: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Close() }()
	stats, err := p.Inspect(ctx, []string{"stock"})
	if err != nil {
		t.Fatal(err)
	}
	var queues []string
	for _, s := range stats {
		queues = append(queues, s.Queue)
	}
	want := []string{three.Name + "/stock-p0", three.Name + "/stock-p1", three.Name + "/stock-p2"}
	if len(queues) != 3 || queues[0] != want[0] || queues[1] != want[1] || queues[2] != want[2] {
		t.Errorf("inspected %v, want %v", queues, want)
	}
}

// TestPullRequestHeartbeat: the subscriber's pull requests ask the server
// for an idle heartbeat every second and expire after 5s, so that a pull
// request lost with a dead consumer leader (one the new leader does not
// know of, such as one sent just before the kill) is noticed after two
// missed heartbeats, about 2s, and sent again; nats.go's defaults (30s
// expiry, 15s heartbeat) took up to 30s, during which nothing is consumed.
func TestPullRequestHeartbeat(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	n := newNames()
	watch, err := natsgo.Connect(srv.url())
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	reqs := make(chan []byte, 100)
	if _, err := watch.Subscribe("$JS.API.CONSUMER.MSG.NEXT."+n.stream.Name+".hb", func(m *natsgo.Msg) {
		select {
		case reqs <- m.Data:
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	subscribe(t, srv.url(), n.stream, "hb", ackAll)
	var req struct {
		Expires   time.Duration `json:"expires"`
		Heartbeat time.Duration `json:"idle_heartbeat"`
	}
	select {
	case data := <-reqs:
		if err := json.Unmarshal(data, &req); err != nil {
			t.Fatalf("pull request %s: %v", data, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the subscriber sent no pull request")
	}
	if req.Expires != 5*time.Second || req.Heartbeat != time.Second {
		t.Errorf("pull request expires after %v with a heartbeat every %v; want 5s and 1s", req.Expires, req.Heartbeat)
	}
}

// TestResetAfterConsumerVanished: a reset that finds no durable consumer
// (a delete whose reply was lost, so that the reset was tried again; or an
// operator's delete) starts after the acknowledgement floor this process
// last read, not from the stream's start: what was acknowledged is not
// delivered again.
func TestResetAfterConsumerVanished(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	n := newNames()
	pub := newPublisher(t, srv.url(), n.stream)
	var mu sync.Mutex
	count := map[string]int{}
	deliver := func(ctx context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
		mu.Lock()
		for _, d := range ds {
			count[d.Message.Headers["trace"]]++
		}
		mu.Unlock()
		return ackAll(ctx, ds)
	}
	delivered := func(trace string) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			return count[trace] > 0
		}
	}
	var msgs []idem.Message
	for i := range 10 {
		msgs = append(msgs, brokertest.NewMessage(t, "test.order.placed.v1", "1", i))
	}
	brokertest.Publish(t, pub, msgs...)
	stop := subscribe(t, srv.url(), n.stream, "stock", deliver)
	testsvc.WaitFor(t, 20*time.Second, "the 10 messages delivered", delivered("9"))
	stop() // acknowledges them: the consumer's floor is 10
	// A second subscriber reads the floor when it takes over.
	subscribe(t, srv.url(), n.stream, "stock", deliver, func(c *nats.SubscriberConfig) { c.StandbyPoll = 50 * time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := jsOf(t, srv.url()).DeleteConsumer(ctx, n.stream.Name, "stock"); err != nil {
		t.Fatal(err)
	}
	brokertest.Publish(t, pub, brokertest.NewMessage(t, "test.order.placed.v1", "1", 10))
	// In stream order, anything delivered again comes before message 10.
	testsvc.WaitFor(t, 20*time.Second, "the message published after the delete delivered", delivered("10"))
	mu.Lock()
	defer mu.Unlock()
	for i := range 10 {
		if c := count[strconv.Itoa(i)]; c != 1 {
			t.Errorf("message %d delivered %d times, want once (the consumer came back from the stream's start)", i, c)
		}
	}
}
