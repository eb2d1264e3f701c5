package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/internal/testdb"
)

// Timings of the group tests: short, so that takeovers are quick, with
// room for a loaded machine.
const (
	testHeartbeat  = 200 * time.Millisecond
	testLeaseTTL   = time.Second
	testPartitions = 6
	// stopTime is how long a subscriber's Stop takes to settle its work
	// in flight (recorder.stopTime): long enough that a replica starting a
	// partition before the previous owner's Stop returned is seen.
	stopTime = 150 * time.Millisecond
)

// groupDBs runs fn on a fresh PostgreSQL database and a fresh SQLite one.
func groupDBs(t *testing.T, fn func(t *testing.T, drv driver.Driver[*sql.Tx])) {
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		pg := testdb.NewPostgres(t)
		fn(t, postgres.NewSQL(pg.DB))
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		fn(t, testdb.NewSQLite(t).Driver)
	})
}

// recorder records the Start and Stop calls of the subscribers of every
// replica, in the order they happen, and every time a partition's
// subscriber starts while another of the same partition runs.
type recorder struct {
	mu         sync.Mutex
	events     []groupEvent
	running    map[int]string // partition -> member running it
	violations []string
	// stopTime is how long the subscribers' Stop takes.
	stopTime time.Duration
}

type groupEvent struct {
	start     bool
	member    string
	partition int
	at        time.Time
}

func newRecorder() *recorder { return &recorder{running: map[int]string{}, stopTime: stopTime} }

func (r *recorder) start(member string, p int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if other, ok := r.running[p]; ok {
		r.violations = append(r.violations, fmt.Sprintf("partition %d started by %s while %s runs it", p, member, other))
	}
	r.running[p] = member
	r.events = append(r.events, groupEvent{start: true, member: member, partition: p, at: time.Now()})
}

func (r *recorder) stop(member string, p int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running[p] == member {
		delete(r.running, p)
	}
	r.events = append(r.events, groupEvent{member: member, partition: p, at: time.Now()})
}

// mark returns the number of events so far.
func (r *recorder) mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

func (r *recorder) since(i int) []groupEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events[i:])
}

// runningBy returns the partitions the recorder sees running, per member.
func (r *recorder) runningBy() map[string][]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string][]int{}
	for p, m := range r.running {
		out[m] = append(out[m], p)
	}
	for _, ps := range out {
		slices.Sort(ps)
	}
	return out
}

func (r *recorder) check(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, v := range r.violations {
		t.Error(v)
	}
}

// recSub is a broker.Subscriber that records its Start and Stop.
type recSub struct {
	rec       *recorder
	member    string
	partition int
	once      sync.Once
	started   atomic.Bool
}

func (s *recSub) Start(context.Context) error {
	s.started.Store(true)
	s.rec.start(s.member, s.partition)
	return nil
}

// Stop takes recorder.stopTime to settle the work in flight, as a transport's does,
// unless ctx ends first (abandoned).
func (s *recSub) Stop(ctx context.Context) error {
	var err error
	s.once.Do(func() {
		if !s.started.Load() {
			return
		}
		t := time.NewTimer(s.rec.stopTime)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			err = ctx.Err()
		}
		s.rec.stop(s.member, s.partition)
	})
	return err
}

// switchDriver is a driver whose pool can be cut off: a database away for
// one replica only.
type switchDriver struct {
	driver.Driver[*sql.Tx]
	off *atomic.Bool
}

func (d switchDriver) Pool() driver.Executor { return switchExec{d.Driver.Pool(), d.off} }

type switchExec struct {
	ex  driver.Executor
	off *atomic.Bool
}

var errAway = errors.New("test: database away")

func (e switchExec) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	if e.off.Load() {
		return 0, errAway
	}
	return e.ex.Exec(ctx, q, args...)
}

func (e switchExec) Query(ctx context.Context, q string, args ...any) (driver.Rows, error) {
	if e.off.Load() {
		return nil, errAway
	}
	return e.ex.Query(ctx, q, args...)
}

// replica starts a group member named member on drv, recording into rec.
func replica(t *testing.T, drv driver.Driver[*sql.Tx], rec *recorder, member string) *Group {
	t.Helper()
	c, err := New(drv, Config{Name: "stock"})
	if err != nil {
		t.Fatal(err)
	}
	g, err := NewGroup(c, GroupConfig{
		Partitions: testPartitions,
		MemberID:   member,
		Heartbeat:  testHeartbeat,
		LeaseTTL:   testLeaseTTL,
		Subscriber: func(p int) (broker.Subscriber, error) {
			return &recSub{rec: rec, member: member, partition: p}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := g.Stop(ctx); err != nil {
			t.Errorf("stop %s: %v", member, err)
		}
	})
	return g
}

// waitBalanced waits until groups own every partition exactly once, each
// between floor(P/N) and ceil(P/N), as the recorder also sees them run.
func waitBalanced(t *testing.T, rec *recorder, groups ...*Group) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		problem := balanced(rec, groups)
		if problem == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no balanced assignment after 30s: %s", problem)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func balanced(rec *recorder, groups []*Group) string {
	owners := map[int][]string{}
	lo, hi := testPartitions/len(groups), (testPartitions+len(groups)-1)/len(groups)
	running := rec.runningBy()
	for _, g := range groups {
		owned := g.Owned()
		if len(owned) < lo || len(owned) > hi {
			return fmt.Sprintf("%s owns %v, want %d to %d partitions", g.MemberID(), owned, lo, hi)
		}
		if !slices.Equal(owned, running[g.MemberID()]) {
			return fmt.Sprintf("%s owns %v, runs %v", g.MemberID(), owned, running[g.MemberID()])
		}
		for _, p := range owned {
			owners[p] = append(owners[p], g.MemberID())
		}
	}
	for p := range testPartitions {
		if len(owners[p]) != 1 {
			return fmt.Sprintf("partition %d owned by %v", p, owners[p])
		}
	}
	return ""
}

// TestGroupConverges: 1, 2 and 3 replicas, started one after the other,
// reach a balanced assignment with every partition owned exactly once,
// and never run two subscribers of one partition at once.
func TestGroupConverges(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("replicas=%d", n), func(t *testing.T) {
			t.Parallel()
			groupDBs(t, func(t *testing.T, drv driver.Driver[*sql.Tx]) {
				rec := newRecorder()
				var groups []*Group
				for i := range n {
					groups = append(groups, replica(t, drv, rec, fmt.Sprintf("r%d", i)))
				}
				waitBalanced(t, rec, groups...)
				rec.check(t)
			})
		})
	}
}

// TestGroupLeaveHandsOver: a replica that stops hands its partitions over
// cooperatively: each of its subscribers stops before the other replica's
// subscriber of that partition starts.
func TestGroupLeaveHandsOver(t *testing.T) {
	groupDBs(t, func(t *testing.T, drv driver.Driver[*sql.Tx]) {
		rec := newRecorder()
		// Stops longer than two heartbeats: a release before the stop
		// ends would let a start during it.
		rec.stopTime = 3 * testHeartbeat
		a := replica(t, drv, rec, "a")
		b := replica(t, drv, rec, "b")
		waitBalanced(t, rec, a, b)
		leaving := b.Owned()
		mark := rec.mark()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		waitBalanced(t, rec, a)
		events := rec.since(mark)
		for _, p := range leaving {
			stopped, started := -1, -1
			for i, e := range events {
				switch {
				case e.partition == p && !e.start && e.member == "b" && stopped < 0:
					stopped = i
				case e.partition == p && e.start && e.member == "a" && started < 0:
					started = i
				}
			}
			if stopped < 0 || started < 0 || stopped > started {
				t.Errorf("partition %d: b stopped at event %d, a started at event %d; want b's stop first", p, stopped, started)
			}
		}
		rec.check(t)
	})
}

// TestGroupKilledTakenOver: a replica killed (its subscribers gone, no
// release, no more heartbeats) has its partitions taken by the others
// within LeaseTTL + Heartbeat (plus the statements' time).
func TestGroupKilledTakenOver(t *testing.T) {
	groupDBs(t, func(t *testing.T, drv driver.Driver[*sql.Tx]) {
		rec := newRecorder()
		a := replica(t, drv, rec, "a")
		b := replica(t, drv, rec, "b")
		waitBalanced(t, rec, a, b)
		victim := b.Owned()
		mark := rec.mark()
		killed := time.Now()
		b.crash()
		waitBalanced(t, rec, a)
		var last time.Time
		for _, e := range rec.since(mark) {
			if e.start && e.member == "a" && slices.Contains(victim, e.partition) {
				last = e.at
			}
		}
		took := last.Sub(killed)
		t.Logf("partitions %v of the killed replica taken over %v after the kill (LeaseTTL %v, Heartbeat %v)", victim, took, testLeaseTTL, testHeartbeat)
		// LeaseTTL + Heartbeat on a quiet machine; the statements of a
		// loaded one (a full test run on 2 cores) take seconds more.
		if limit := 3*testLeaseTTL + 2*testHeartbeat; took > limit {
			t.Errorf("takeover took %v, want at most %v (LeaseTTL + Heartbeat, and room for slow statements)", took, limit)
		}
		rec.check(t)
	})
}

// TestGroupCannotRenewStops: a replica cut off from its database stops its
// subscribers before their leases expire; the other replica takes them
// (never two at once), and the cut-off one takes its share again when the
// database is back.
func TestGroupCannotRenewStops(t *testing.T) {
	groupDBs(t, func(t *testing.T, drv driver.Driver[*sql.Tx]) {
		rec := newRecorder()
		var off atomic.Bool
		a := replica(t, drv, rec, "a")
		b := replica(t, switchDriver{drv, &off}, rec, "b")
		waitBalanced(t, rec, a, b)
		cut := b.Owned()
		mark := rec.mark()
		away := time.Now()
		off.Store(true)
		waitBalanced(t, rec, a)
		// b's last renewal was sent before away: its leases expire by
		// away + LeaseTTL, by which time its subscribers must have stopped.
		for _, e := range rec.since(mark) {
			if !e.start && e.member == "b" {
				if ran := e.at.Sub(away); ran >= testLeaseTTL {
					t.Errorf("b stopped partition %d %v after the database went away, at or past its lease (%v)", e.partition, ran, testLeaseTTL)
				}
			}
		}
		for _, p := range cut {
			if slices.Contains(b.Owned(), p) {
				t.Errorf("b still owns %d", p)
			}
		}
		off.Store(false)
		waitBalanced(t, rec, a, b)
		rec.check(t)
	})
}

// TestGroupStartWithoutTables: a database without migration 0008 fails
// Start, saying to migrate.
func TestGroupStartWithoutTables(t *testing.T) {
	db := testdb.NewSQLite(t, testdb.Options{NoMigrate: true})
	c, err := New(db.Driver, Config{Name: "stock"})
	if err != nil {
		t.Fatal(err)
	}
	g, err := NewGroup(c, GroupConfig{Partitions: 2, Subscriber: func(int) (broker.Subscriber, error) { return nil, errAway }})
	if err != nil {
		t.Fatal(err)
	}
	err = g.Start(context.Background())
	if !errors.Is(err, idem.ErrMissingTable) || !strings.Contains(err.Error(), "idem migrate up") {
		t.Errorf("Start without the tables: %v, want idem.ErrMissingTable saying to run idem migrate up", err)
	}
	if err := g.Stop(context.Background()); err != nil {
		t.Errorf("Stop after a failed Start: %v", err)
	}
}

// TestGroupConfig: the configuration's errors say what to set.
func TestGroupConfig(t *testing.T) {
	db := testdb.NewSQLite(t)
	c, err := New(db.Driver, Config{Name: "stock"})
	if err != nil {
		t.Fatal(err)
	}
	sub := func(int) (broker.Subscriber, error) { return nil, errAway }
	for _, tc := range []struct {
		cfg  GroupConfig
		want string
	}{
		{GroupConfig{Subscriber: sub}, "Partitions 0"},
		{GroupConfig{Partitions: 2}, "Subscriber is required"},
		{GroupConfig{Partitions: 2, Subscriber: sub, Heartbeat: time.Second, LeaseTTL: 1500 * time.Millisecond}, "raise LeaseTTL"},
	} {
		if _, err := NewGroup(c, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewGroup(%+v): %v, want an error saying %q", tc.cfg, err, tc.want)
		}
	}
	g, err := NewGroup(c, GroupConfig{Partitions: 2, Subscriber: sub})
	if err != nil {
		t.Fatal(err)
	}
	if g.cfg.Heartbeat != GroupHeartbeatDefault || g.cfg.LeaseTTL != GroupLeaseTTLDefault || g.MemberID() == "" {
		t.Errorf("defaults: heartbeat %v, TTL %v, member %q", g.cfg.Heartbeat, g.cfg.LeaseTTL, g.MemberID())
	}
}
