// Package testload is the load the broker cluster tests (broker/kafka,
// broker/nats) run while they move leaders, stop, kill or freeze servers:
// a publisher that publishes version after version of Aggregates
// aggregates, a version published again until every message of it is
// acknowledged (as a relay does), and an idempotent consumer on PostgreSQL
// that records each application. After each fault a test waits until a
// version published after it has been applied (WaitResumed: the publisher
// and the subscriber resumed, never restarted); at the end, Finish checks
// that every acknowledged version was applied exactly once, each
// aggregate's versions in order.
//
//	l := testload.New(t)
//	// ... a cluster, a publisher pub, a subscriber delivering to l.Deliver
//	l.Start(t, pub)
//	t0 := time.Now()
//	// ... a fault
//	l.WaitResumed(t, "broker stopped", t0, time.Minute)
//	l.Finish(t)
package testload

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
)

const (
	// Aggregates is how many aggregates a version has an event of.
	Aggregates = 8
	// Pace is the pause between two versions: about 8 x 100 events/s,
	// leaving the two cores of the test machine to the servers.
	Pace = 10 * time.Millisecond
	// Consumer is the consumer's name (a subscriber's group or durable
	// consumer may take it too).
	Consumer = "stock"
	// EventName is the name of the load's events.
	EventName = "order.order.changed.v1"
)

// caughtUp is what WaitCaughtUp waits for, not logged as a measure.
const caughtUp = "caught up"

// Load is a versioned load and its consumer. Make one with New.
type Load struct {
	// PG is the consumer's database; its table applied holds one row per
	// application (seq, aggregate_id, version).
	PG *testdb.PG
	// Consumer is the idempotent consumer; Deliver hands it the batches.
	Consumer *inbox.Consumer[pgx.Tx]

	mu sync.Mutex
	// okStart[v-1] is when the attempt that published version v began,
	// okEnd[v-1] when it was acknowledged.
	okStart, okEnd []time.Time
	// appliedAt[v] is when an event of version v was first seen applied
	// (after its transaction committed).
	appliedAt map[int64]time.Time
	// attempt[aggregate/version] is the delivery attempt that applied it:
	// a late application that was a redelivery points at a lost delivery.
	attempt  map[string]int
	failures int   // failed publish attempts
	lastErr  error // the last one's error, for the logs

	stopOnce sync.Once
	stopLoad chan struct{}
	loadDone chan struct{}
}

// New returns a load, not started, with its consumer on a fresh
// PostgreSQL schema.
func New(t *testing.T) *Load {
	t.Helper()
	l := &Load{
		PG:        testdb.NewPostgres(t),
		appliedAt: map[int64]time.Time{},
		attempt:   map[string]int{},
		stopLoad:  make(chan struct{}),
		loadDone:  make(chan struct{}),
	}
	l.PG.Exec(t, `CREATE TABLE applied (seq bigserial PRIMARY KEY, aggregate_id text NOT NULL, version bigint NOT NULL)`)
	cons, err := inbox.New[pgx.Tx](l.PG.Driver, inbox.Config{Name: Consumer, Logger: brokertest.Logger(),
		Retry: inbox.RetryPolicy{InitialDelay: 20 * time.Millisecond, MaxDelay: 100 * time.Millisecond, Jitter: -1}})
	if err != nil {
		t.Fatal(err)
	}
	cons.Handle(EventName, func(ctx context.Context, tx pgx.Tx, ev idem.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO applied (aggregate_id, version) VALUES ($1, $2)`, ev.AggregateID, ev.AggregateVersion)
		return err
	})
	l.Consumer = cons
	return l
}

// Deliver is the subscriber's broker.DeliverFunc: it hands a batch to the
// consumer and notes when each version was first applied.
func (l *Load) Deliver(ctx context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
	disps, errs := l.Consumer.DeliverBatch(ctx, ds)
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, d := range ds {
		if i >= len(disps) || disps[i].Outcome != inbox.Applied {
			continue
		}
		ev, err := idem.Decode(d.Message)
		if err != nil {
			continue
		}
		if _, ok := l.appliedAt[ev.AggregateVersion]; !ok {
			l.appliedAt[ev.AggregateVersion] = now
		}
		l.attempt[fmt.Sprintf("%s/%d", ev.AggregateID, ev.AggregateVersion)] = d.Attempt
	}
	return disps, errs
}

// Start publishes through pub in the background until Stop (at the end of
// the test at the latest), and waits until a first version was applied.
func (l *Load) Start(t *testing.T, pub broker.Publisher) {
	t.Helper()
	go l.load(pub)
	t.Cleanup(l.Stop)
	l.WaitResumed(t, "start", time.Now(), 60*time.Second)
}

// load publishes version 1, 2, ... of every aggregate, one version per
// call, publishing a version again until all of it is acknowledged, until
// Stop.
func (l *Load) load(pub broker.Publisher) {
	defer close(l.loadDone)
	for v := int64(1); ; v++ {
		msgs := make([]idem.Message, Aggregates)
		for a := range msgs {
			ev, err := idem.NewEvent(EventName, "order", fmt.Sprintf("a%d", a), map[string]int64{"version": v})
			if err != nil {
				panic(err)
			}
			ev.AggregateVersion = v
			if msgs[a], err = idem.NewMessage(ev); err != nil {
				panic(err)
			}
		}
		for {
			select {
			case <-l.stopLoad:
				return
			default:
			}
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := pub.Publish(ctx, msgs)
			cancel()
			l.mu.Lock()
			if err == nil {
				l.okStart = append(l.okStart, start)
				l.okEnd = append(l.okEnd, time.Now())
			} else {
				l.failures++
				l.lastErr = err
			}
			l.mu.Unlock()
			if err == nil {
				break
			}
			select {
			case <-l.stopLoad:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
		select {
		case <-l.stopLoad:
			return
		case <-time.After(Pace):
		}
	}
}

// Stop stops publishing and returns once the publishing goroutine has
// ended. It may be called more than once.
func (l *Load) Stop() {
	l.stopOnce.Do(func() { close(l.stopLoad) })
	<-l.loadDone
}

// resumed returns, once a version whose publication began after t0 has
// been applied, how long after t0 its publication was acknowledged and it
// was applied.
func (l *Load) resumed(t0 time.Time) (pub, cons time.Duration, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	i, _ := slices.BinarySearchFunc(l.okStart, t0, func(s, t time.Time) int { return s.Compare(t) })
	if i == len(l.okStart) {
		return 0, 0, false
	}
	pub = l.okEnd[i].Sub(t0)
	// The first version published after t0 that was applied (one may have
	// been applied before a later one only if it had been published
	// earlier, which it was not, so the first applied is i's or later).
	for v := i; v < len(l.okStart); v++ {
		if at, ok := l.appliedAt[int64(v+1)]; ok {
			return pub, at.Sub(t0), true
		}
	}
	return 0, 0, false
}

// WaitResumed waits until a version published after t0 (the fault) has
// been applied, logs how long publishing and consuming took to resume
// ("measure: what: ..."), and returns it. It fails the test after timeout.
func (l *Load) WaitResumed(t *testing.T, what string, t0 time.Time, timeout time.Duration) (pub, cons time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if p, c, ok := l.resumed(t0); ok {
			if what != caughtUp {
				t.Logf("measure: %s: publishing again after %v, consuming after %v", what, p.Round(time.Millisecond), c.Round(time.Millisecond))
			}
			return p, c
		}
		if time.Now().After(deadline) {
			l.mu.Lock()
			n, f, last := len(l.okStart), l.failures, l.lastErr
			l.mu.Unlock()
			t.Fatalf("%s: no version published after the fault and applied within %v (%d versions published, %d failed attempts, last error %v, %d applied)",
				what, timeout, n, f, last, l.Consumer.Stats().Applied)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitCaughtUp waits until the consumer has applied a version published
// after every version acknowledged so far: measurements then start from no
// backlog.
func (l *Load) WaitCaughtUp(t *testing.T) {
	t.Helper()
	l.WaitResumed(t, caughtUp, time.Now(), 120*time.Second)
}

// WaitVersions waits until n versions have been published, so that a fault
// hits a stream with history and a load in full swing.
func (l *Load) WaitVersions(t *testing.T, n int) {
	t.Helper()
	testsvc.WaitFor(t, 120*time.Second, fmt.Sprintf("%d versions published", n), func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.okStart) >= n
	})
}

// Finish stops the load, waits until every acknowledged version has been
// applied and checks that each was applied once, in order per aggregate.
func (l *Load) Finish(t *testing.T) {
	t.Helper()
	l.Stop()
	l.mu.Lock()
	versions, failures := len(l.okStart), l.failures
	l.mu.Unlock()
	want := versions * Aggregates
	testsvc.WaitFor(t, 90*time.Second, fmt.Sprintf("the %d events of %d versions applied", want, versions), func() bool {
		return l.PG.Count(t, "(SELECT DISTINCT aggregate_id, version FROM applied WHERE version <= $1) d", versions) == want
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := l.PG.Pool.Query(ctx, `SELECT aggregate_id, version FROM applied ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	last := map[string]int64{}
	n, disorder := 0, 0
	for rows.Next() {
		var agg string
		var v int64
		if err := rows.Scan(&agg, &v); err != nil {
			t.Fatal(err)
		}
		n++
		if v != last[agg]+1 {
			// Out of order (or twice): report the first few only.
			if disorder++; disorder <= 10 {
				l.mu.Lock()
				attempt := l.attempt[fmt.Sprintf("%s/%d", agg, v)]
				l.mu.Unlock()
				t.Errorf("aggregate %s: version %d applied after version %d (at its delivery attempt %d)", agg, v, last[agg], attempt)
			}
		}
		last[agg] = v
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	extra := 0
	for a := range Aggregates {
		got := last[fmt.Sprintf("a%d", a)]
		if got < int64(versions) {
			t.Errorf("aggregate a%d: last version applied %d, want %d", a, got, versions)
		}
		// Versions above the last acknowledged one come from an attempt
		// that failed on one message after the broker stored the others;
		// they are published again (and deduplicated) by the next attempt,
		// which the stop interrupted. Anything else is a double.
		extra += max(0, int(got)-versions)
	}
	if n != want+extra {
		t.Errorf("%d applications, want %d (+%d of the interrupted version)", n, want, extra)
	}
	if disorder > 10 {
		t.Errorf("... %d applications out of order in all", disorder)
	}
	s := l.Consumer.Stats()
	t.Logf("checked %d versions x %d aggregates (%d applications out of order); %d failed publish attempts; consumer: %d applied, %d duplicates skipped",
		versions, Aggregates, disorder, failures, s.Applied, s.Duplicates)
}

// Median returns the median of ds (the upper one of an even count).
func Median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
