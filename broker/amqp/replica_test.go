package amqp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/internal/testsvc"
)

// childEnv is brokertest.ChildMain's variable: its presence makes the test
// binary run a child subscriber, as {"postgres_url", "consumer", "spec"}.
const childEnv = "IDEM_BROKERTEST_CHILD"

// replicaName is the event name of the replica tests.
const replicaName = "order.order.changed.v1"

// replica is a child process running subscribers of one consumer.
type replica struct {
	name   string
	cmd    *exec.Cmd
	done   chan struct{} // closed when the process has exited
	killed bool          // by kill or stop

	mu      sync.Mutex
	active  map[string]bool // queue -> logged active (and not standing by since)
	standby map[string]bool // queue -> logged standing by
	stderr  strings.Builder
}

// startReplica starts a child process subscribing as the consumer stock on
// b's queue with spec, whose subscribers log their activity on stderr.
func startReplica(t *testing.T, b *bundle, name string, spec childSpec) *replica {
	t.Helper()
	b.consumer(t, nil) // creates the effect table before the children race to
	spec.URL, spec.Exchange, spec.Queue, spec.Bindings, spec.Log = b.url, b.exchange, b.queue, []string{"#"}, true
	spec.StandbyPoll, spec.BatchSize, spec.Workers = 100*time.Millisecond, 10, 2
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := json.Marshal(map[string]any{"postgres_url": b.pg.URL, "consumer": "stock", "spec": json.RawMessage(raw)})
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{name: name, done: make(chan struct{}), active: map[string]bool{}, standby: map[string]bool{}}
	r.cmd = exec.Command(exe, "-test.run=^$")
	r.cmd.Env = append(os.Environ(), childEnv+"="+string(cfg))
	pipe, err := r.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go r.scan(pipe)
	t.Cleanup(func() {
		_ = r.cmd.Process.Kill()
		<-r.done
		if t.Failed() {
			t.Logf("replica %s stderr:\n%s", r.name, r.output())
		}
	})
	return r
}

// scan reads the child's log lines until it exits.
func (r *replica) scan(pipe io.Reader) {
	defer close(r.done)
	sc := bufio.NewScanner(pipe)
	for sc.Scan() {
		line := sc.Text()
		r.mu.Lock()
		r.stderr.WriteString(line + "\n")
		queue := ""
		if _, after, ok := strings.Cut(line, " queue="); ok {
			queue, _, _ = strings.Cut(after, " ")
		}
		switch {
		case strings.Contains(line, "amqp subscriber: active"):
			r.active[queue], r.standby[queue] = true, false
		case strings.Contains(line, "amqp subscriber: standing by"), strings.Contains(line, "amqp subscriber: attached"):
			r.standby[queue], r.active[queue] = true, false
		}
		r.mu.Unlock()
	}
	_ = r.cmd.Wait()
}

func (r *replica) output() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stderr.String()
}

// isActive reports whether the replica logged that it consumes queue.
func (r *replica) isActive(queue string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.active[queue]
}

// standsBy reports whether the replica logged that it stands by on queue.
func (r *replica) standsBy(queue string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.standby[queue]
}

func (r *replica) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// kill kills the replica with SIGKILL and waits until it has exited.
func (r *replica) kill(t *testing.T) {
	t.Helper()
	r.killed = true
	if err := r.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-r.done
}

// stop stops the replica with SIGTERM (it stops its subscribers) and waits
// until it has exited.
func (r *replica) stop(t *testing.T) {
	t.Helper()
	r.killed = true
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-r.done
}

// versions returns the messages of aggregates "a0"... with versions 1 to
// k, in publishing order: version by version.
func versions(t *testing.T, aggregates, k int) []idem.Message {
	var msgs []idem.Message
	for v := 1; v <= k; v++ {
		for a := range aggregates {
			msgs = append(msgs, brokertest.NewMessage(t, replicaName, fmt.Sprintf("a%d", a), v))
		}
	}
	return msgs
}

// produce publishes msgs in batches of 50 in the background; the returned
// channel yields the outcome.
func produce(t *testing.T, pub *amqp.Publisher, msgs []idem.Message) <-chan error {
	done := make(chan error, 1)
	go func() {
		for start := 0; start < len(msgs); start += 50 {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := pub.Publish(ctx, msgs[start:min(len(msgs), start+50)])
			cancel()
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	return done
}

// activeOn returns the live replica that logged it is active on queue, or
// nil; it fails the test when two are.
func activeOn(t *testing.T, rs []*replica, queue string) *replica {
	t.Helper()
	var found *replica
	for _, r := range rs {
		if r.exited() && !r.killed {
			t.Fatalf("replica %s exited by itself:\n%s", r.name, r.output())
		}
		if !r.exited() && r.isActive(queue) {
			if found != nil {
				t.Fatalf("replicas %s and %s both active on %s", found.name, r.name, queue)
			}
			found = r
		}
	}
	return found
}

// killMidRun waits until at least at events are applied, checks that some
// remain, and kills victim.
func killMidRun(t *testing.T, b *bundle, victim *replica, at, total int) {
	t.Helper()
	testsvc.WaitFor(t, 2*time.Minute, fmt.Sprintf("%d events applied", at), func() bool { return b.pg.Count(t, "effect") >= at })
	victim.kill(t)
	n := b.pg.Count(t, "effect")
	if n >= total {
		t.Fatalf("replica %s killed after every event was applied (%d): not mid-run", victim.name, n)
	}
	t.Logf("killed replica %s with %d of %d events applied", victim.name, n, total)
}

// finish waits until every event is applied and the queues are empty, stops
// the live replicas, and checks that each event was applied once and each
// aggregate's events in order.
func finish(t *testing.T, b *bundle, produced <-chan error, msgs []idem.Message, queues []string, rs []*replica) {
	t.Helper()
	if err := <-produced; err != nil {
		t.Fatalf("publish: %v", err)
	}
	testsvc.WaitFor(t, 3*time.Minute, "every event applied", func() bool {
		return b.pg.Count(t, "(SELECT DISTINCT event_id FROM effect) e") == len(msgs)
	})
	for _, r := range rs {
		if !r.exited() {
			r.stop(t)
		}
	}
	for _, q := range queues {
		if n := queueDepth(t, b.url, q); n != 0 {
			t.Errorf("%d messages left in %s", n, q)
		}
	}
	brokertest.CheckOnceInOrder(t, b.pg, "stock", msgs)
	if n := b.pg.Count(t, "processed_event WHERE consumer_name = 'stock'"); n != len(msgs) {
		t.Errorf("processed_event rows: %d, want %d", n, len(msgs))
	}
}

// TestReplicasOneActive runs two and three processes of one consumer on one
// classic queue, and two on a quorum queue: one consumes, the others stand
// by; killing the active one (kill -9) mid-run hands the queue to another,
// and every event is applied once, each aggregate's in order.
func TestReplicasOneActive(t *testing.T) {
	for _, c := range []struct {
		n  int
		qt amqp.QueueType
	}{{2, amqp.Classic}, {3, amqp.Classic}, {2, amqp.Quorum}} {
		n := c.n
		t.Run(fmt.Sprintf("%d_processes_%s", n, c.qt), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var rs []*replica
			for i := range n {
				rs = append(rs, startReplica(t, b, fmt.Sprint(i), childSpec{QueueType: c.qt}))
			}
			if c.qt == amqp.Quorum {
				// RabbitMQ tells no consumer it is the single active one: the
				// replicas log attaching, and "active" at the first delivery.
				testsvc.WaitFor(t, time.Minute, "every replica attached", func() bool {
					for _, r := range rs {
						if !r.standsBy(b.queue) {
							return false
						}
					}
					return true
				})
			} else {
				testsvc.WaitFor(t, time.Minute, "one replica active, the others standing by", func() bool {
					standing := 0
					for _, r := range rs {
						if r.standsBy(b.queue) {
							standing++
						}
					}
					return activeOn(t, rs, b.queue) != nil && standing == n-1
				})
			}
			msgs := versions(t, 100, 12)
			produced := produce(t, b.pub, msgs)
			testsvc.WaitFor(t, time.Minute, "one replica active", func() bool { return activeOn(t, rs, b.queue) != nil })
			// Kill the active replica n-1 times, each at a further point.
			for kill := 1; kill < n; kill++ {
				killMidRun(t, b, activeOn(t, rs, b.queue), kill*len(msgs)/(2*n), len(msgs))
				testsvc.WaitFor(t, time.Minute, "another replica active", func() bool { return activeOn(t, rs, b.queue) != nil })
			}
			finish(t, b, produced, msgs, []string{b.queue}, rs)
		})
	}
}

// TestReplicasPartitioned splits a consumer over 4 partition queues, taken
// by two processes (partitions 0-1 and 2-3) with a third standing by for
// all of them; killing the first two in turn mid-run hands their
// partitions to the third, and every event is applied once, each
// aggregate's in order.
func TestReplicasPartitioned(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const p = 4
	var queues []string
	for k := range p {
		queues = append(queues, amqp.PartitionQueue(b.queue, k))
	}
	low := startReplica(t, b, "low", childSpec{Partitions: p, PartitionList: []int{0, 1}})
	high := startReplica(t, b, "high", childSpec{Partitions: p, PartitionList: []int{2, 3}})
	rs := []*replica{low, high}
	testsvc.WaitFor(t, time.Minute, "partitions 0-1 and 2-3 active", func() bool {
		return activeOn(t, rs, queues[0]) == low && activeOn(t, rs, queues[1]) == low &&
			activeOn(t, rs, queues[2]) == high && activeOn(t, rs, queues[3]) == high
	})
	spare := startReplica(t, b, "spare", childSpec{Partitions: p, PartitionList: []int{0, 1, 2, 3}})
	rs = append(rs, spare)
	testsvc.WaitFor(t, time.Minute, "the spare replica standing by on every partition", func() bool {
		for _, q := range queues {
			if !spare.standsBy(q) {
				return false
			}
		}
		return true
	})
	msgs := versions(t, 100, 12)
	produced := produce(t, b.pub, msgs)
	killMidRun(t, b, low, len(msgs)/4, len(msgs))
	testsvc.WaitFor(t, time.Minute, "the spare active on partitions 0 and 1", func() bool {
		return activeOn(t, rs, queues[0]) == spare && activeOn(t, rs, queues[1]) == spare
	})
	killMidRun(t, b, high, len(msgs)/2, len(msgs))
	testsvc.WaitFor(t, time.Minute, "the spare active on partitions 2 and 3", func() bool {
		return activeOn(t, rs, queues[2]) == spare && activeOn(t, rs, queues[3]) == spare
	})
	finish(t, b, produced, msgs, queues, rs)
}

// TestPartitionRouting: every message goes to exactly one partition queue,
// an aggregate's always to the same one, partition Bucket(key) mod P, the
// partitions all get some, the
// Inspector tells each partition queue, and the subscribers receive from
// their partition queue (Delivery.Source) in order.
func TestPartitionRouting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const p = 4
	cfg := func(k int) amqp.SubscriberConfig {
		c := subscriberConfig(b.url, b.exchange, b.queue, "#")
		c.Partitions, c.Partition, c.Logger = p, k, quiet
		return c
	}
	// Declare the topology, then publish while nothing consumes.
	declarer := newSubscriber(t, cfg(0), func(context.Context, []broker.Delivery) ([]broker.Disposition, []error) {
		t.Error("delivery before publishing")
		return nil, nil
	})
	ctx := testsvc.Ctx(t, time.Minute)
	if err := declarer.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := declarer.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	msgs := versions(t, 40, 10)
	brokertest.Publish(t, b.pub, msgs...)

	pub := newInspectingPublisher(t, b.url, b.exchange, func(string) string { return b.queue })
	stats, err := pub.Inspect(ctx, []string{"stock"})
	if err != nil {
		t.Fatal(err)
	}
	var ready int64
	for k, s := range stats {
		if k >= p || s.Queue != amqp.PartitionQueue(b.queue, k) || s.Consumer != "stock" {
			t.Fatalf("Inspect = %+v; want one row per partition queue", stats)
		}
		ready += s.Ready
	}
	if len(stats) != p || ready != int64(len(msgs)) {
		t.Fatalf("Inspect = %+v; want %d partitions holding %d messages in all", stats, p, len(msgs))
	}

	var mu sync.Mutex
	got := map[string][]broker.Delivery{} // by event id
	byKey := map[string][]string{}        // sources
	order := map[string][]string{}        // event ids by key, as delivered
	for k := range p {
		b.subscribe(t, func(_ context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
			mu.Lock()
			defer mu.Unlock()
			disps := make([]broker.Disposition, len(ds))
			for i, d := range ds {
				id, key := d.Message.EventID.String(), string(d.Message.Key)
				got[id] = append(got[id], d)
				byKey[key] = append(byKey[key], d.Source)
				order[key] = append(order[key], id)
				disps[i] = broker.Disposition{Action: broker.Ack, Outcome: broker.Applied}
			}
			return disps, make([]error, len(ds))
		}, func(c *amqp.SubscriberConfig) { *c = cfg(k) })
	}
	testsvc.WaitFor(t, time.Minute, "every message delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == len(msgs)
	})
	mu.Lock()
	defer mu.Unlock()
	used := map[string]bool{}
	for _, m := range msgs {
		if n := len(got[m.EventID.String()]); n != 1 {
			t.Errorf("message %s delivered %d times, want 1", m.EventID, n)
		}
	}
	want := map[string][]string{}
	for _, m := range msgs {
		want[string(m.Key)] = append(want[string(m.Key)], m.EventID.String())
	}
	for key, sources := range byKey {
		for _, s := range sources {
			if s != sources[0] {
				t.Errorf("aggregate %q received from %s and %s, want one partition queue", key, sources[0], s)
				break
			}
		}
		used[sources[0]] = true
		if want := amqp.PartitionQueue(b.queue, amqp.Bucket([]byte(key))%p); sources[0] != want {
			t.Errorf("aggregate %q received from %s, want %s (bucket %d mod %d)", key, sources[0], want, amqp.Bucket([]byte(key)), p)
		}
		if fmt.Sprint(order[key]) != fmt.Sprint(want[key]) {
			t.Errorf("aggregate %q delivered in the order %v, want %v", key, order[key], want[key])
		}
	}
	if len(used) != p {
		t.Errorf("partitions used: %v, want all %d (40 aggregates)", used, p)
	}
	for q := range used {
		if !strings.HasPrefix(q, b.queue+".p") {
			t.Errorf("Delivery.Source %q, want a partition queue", q)
		}
	}
}

// counting returns a deliver func that acks everything and counts it.
func counting(n *atomicCount) broker.DeliverFunc {
	return func(_ context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
		n.add(len(ds))
		disps := make([]broker.Disposition, len(ds))
		for i := range disps {
			disps[i] = broker.Disposition{Action: broker.Ack, Outcome: broker.Applied}
		}
		return disps, make([]error, len(ds))
	}
}

type atomicCount struct {
	mu sync.Mutex
	n  int
}

func (c *atomicCount) add(n int) { c.mu.Lock(); c.n += n; c.mu.Unlock() }
func (c *atomicCount) get() int  { c.mu.Lock(); defer c.mu.Unlock(); return c.n }

// TestStandbyTakesOver: of two subscribers of one queue, in one process,
// the first consumes and the second stands by (Active false, receives
// nothing); once the first stops, the second becomes active and receives
// what follows. Classic queues (exclusive consumer) and quorum queues
// (single active consumer) alike.
func TestStandbyTakesOver(t *testing.T) {
	for _, qt := range []amqp.QueueType{amqp.Classic, amqp.Quorum} {
		t.Run(string(qt), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			cfg := subscriberConfig(b.url, b.exchange, b.queue, "#")
			cfg.QueueType, cfg.StandbyPoll, cfg.Logger = qt, 50*time.Millisecond, quiet
			var first, second atomicCount
			s1 := newSubscriber(t, cfg, counting(&first))
			testsvc.Start(t, s1)
			s2 := newSubscriber(t, cfg, counting(&second))
			testsvc.Start(t, s2)
			brokertest.Publish(t, b.pub, versions(t, 10, 5)...)
			testsvc.WaitFor(t, 30*time.Second, "50 messages to the first subscriber", func() bool { return first.get() == 50 })
			if !s1.Active() || s2.Active() || second.get() != 0 {
				t.Fatalf("first active %v, second active %v with %d messages; want the first only", s1.Active(), s2.Active(), second.get())
			}
			ctx := testsvc.Ctx(t, 30*time.Second)
			if err := s1.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			if s1.Active() {
				t.Error("a stopped subscriber is Active")
			}
			brokertest.Publish(t, b.pub, versions(t, 10, 5)...)
			testsvc.WaitFor(t, 30*time.Second, "50 messages to the second subscriber", func() bool { return second.get() == 50 })
			if !s2.Active() || first.get() != 50 {
				t.Errorf("second active %v, first received %d; want the second active and the first at 50", s2.Active(), first.get())
			}
		})
	}
}

// TestQuorumQueueWithoutSingleActiveConsumer: a quorum queue declared
// without x-single-active-consumer (by an earlier version) is refused with
// the migration to follow, since RabbitMQ would let several subscribers
// consume it at once.
func TestQuorumQueueWithoutSingleActiveConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	withChannel(t, b.url, func(ch *amqp091.Channel) {
		if _, err := ch.QueueDeclare(b.queue, true, false, false, false, amqp091.Table{"x-queue-type": "quorum"}); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() {
		withChannel(t, b.url, func(ch *amqp091.Channel) { _, _ = ch.QueueDelete(b.queue, false, false, false) })
	})
	cfg := subscriberConfig(b.url, b.exchange, b.queue, "#")
	cfg.QueueType, cfg.Logger = amqp.Quorum, quiet
	sub := newSubscriber(t, cfg, counting(new(atomicCount)))
	err := sub.Start(testsvc.Ctx(t, 30*time.Second))
	if err == nil {
		_ = sub.Stop(context.Background())
		t.Fatal("Start on a quorum queue without x-single-active-consumer succeeded")
	}
	for _, want := range []string{"x-single-active-consumer", "rabbitmqctl delete_queue " + b.queue, "PRECONDITION_FAILED"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Start = %v; want it to say %q", err, want)
		}
	}
}

func TestPartitionConfigErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		partitions, partition int
		want                  string
	}{
		{0, 1, "without Partitions"},
		{4, 4, "want 0 to 3"},
		{4, -1, "want 0 to 3"},
		{-1, 0, "Partitions -1"},
		{65, 0, "want 0 (unpartitioned) to 64 (PartitionsMax"},
	} {
		cfg := subscriberConfig("amqp://localhost/", "events", "stock.events", "#")
		cfg.Partitions, cfg.Partition = c.partitions, c.partition
		_, err := amqp.NewSubscriber(cfg, counting(new(atomicCount)))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Partitions %d, Partition %d: %v; want an error saying %q", c.partitions, c.partition, err, c.want)
		}
	}
	cfg := amqp.SubscriberConfig{Queue: "stock.events", Partitions: 8, Partition: 3}
	if got := cfg.ConsumedQueue(); got != "stock.events.p3" {
		t.Errorf("ConsumedQueue = %q, want stock.events.p3", got)
	}
}
