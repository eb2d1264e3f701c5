package inbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/errlog"
	"github.com/idem-go/idem/internal/startstop"
)

// Defaults of GroupConfig.
const (
	// GroupHeartbeatDefault is how often a group member renews its leases.
	GroupHeartbeatDefault = time.Second
	// GroupLeaseTTLDefault is how long a lease lasts after its renewal.
	GroupLeaseTTLDefault = 5 * time.Second
)

// GroupConfig configures a Group.
type GroupConfig struct {
	// Partitions is the number of partitions of the consumer's queue,
	// stream or durable (the transport's SubscriberConfig.Partitions).
	// Required.
	Partitions int
	// Subscriber returns a new, unstarted subscriber of one partition,
	// 0 <= partition < Partitions, delivering to the consumer. The group
	// calls it each time it takes the partition; a stopped subscriber is
	// never started again. Required.
	Subscriber func(partition int) (broker.Subscriber, error)
	// MemberID identifies this replica in the group. It must be unique
	// among the replicas of the consumer: two replicas with one id would
	// take each other's leases as their own and run the same partitions.
	// Defaults to "<hostname>-<pid>-<random>", unique per process.
	MemberID string
	// Heartbeat is how often the member renews its own lease and its
	// partitions' leases, and revisits the assignment. Defaults to 1s.
	Heartbeat time.Duration
	// LeaseTTL is how long a lease lasts after its renewal, by the
	// database's clock: a replica that stops renewing (killed, cut off
	// from the database) loses its partitions LeaseTTL after its last
	// renewal, and the others take them within one more Heartbeat. At
	// least twice Heartbeat. Defaults to 5s.
	LeaseTTL time.Duration
	// Logger receives a line per partition taken or given up, and errors.
	// Defaults to the consumer's logger.
	Logger *slog.Logger
}

// Group runs, on each replica of a consumer, the subscribers of the
// partitions assigned to it, so that any number of replicas (processes
// with the same consumer name) share the consumer's partitions, each
// partition consumed by one replica at a time.
//
// Membership and ownership live in the consumer's database (migration
// 0008, driver.GroupLeases): every Heartbeat the member renews its lease
// and its partitions' leases (timed by the database's clock, LeaseTTL
// long), and reads the live members. Partition p is assigned to the
// (p mod N)-th of the N live members sorted by id. A replica that must give
// a partition up (another joined) stops its subscriber, which settles and
// acknowledges the deliveries in flight, then releases the lease; a replica
// takes a partition only when its lease is free or expired, then starts
// its subscriber. So, between live replicas, a partition's subscriber stops
// before the next one starts.
//
// A replica whose lease was taken over stops that subscriber at once
// (abandoning its deliveries in flight: they come back). A database away
// costs time only: the replica keeps what it owns while its leases are
// valid, and when they can no longer be renewed before they expire, it
// stops the subscribers (a Heartbeat before the expiry, abandoning their
// work in flight at the expiry), so that it never runs a partition past
// its lease; it takes them again once the database is back. The lease is
// counted from when the renewal was sent, on the replica's monotonic
// clock, which the database's expiry cannot precede.
//
// Leases order handovers; they do not fence a frozen replica (one paused
// past its lease, that resumes and finishes a delivery). Fencing is the
// transport's: each partition queue or durable has one active consumer at
// a time (exclusive consumers on RabbitMQ, an owner lease on NATS, the
// group protocol on Kafka), and the processed_event marker orders two
// appliers of one event (see docs/ARCHITECTURE.md).
//
// Start it once; Stop gives every partition up cooperatively and leaves
// the group.
type Group struct {
	name   string
	leases driver.GroupLeases
	ex     driver.Executor
	cfg    GroupConfig
	log    *slog.Logger
	dbErrs *errlog.Limiter
	// startErrs logs the subscribers' failed starts, retried every
	// heartbeat.
	startErrs *errlog.Limiter

	// base is the lifecycle; its WorkContext, parent of the subscribers'
	// contexts, ends when Stop runs out of time.
	base startstop.Base

	mu      sync.Mutex
	parts   map[int]*groupPartition // partitions whose lease is held
	crashed bool                    // tests: stopped without releasing
	wg      sync.WaitGroup          // partition goroutines
}

// groupPartition is a partition this member holds the lease of, from its
// acquisition until its release (or loss).
type groupPartition struct {
	n     int
	epoch int64

	// Guarded by Group.mu.
	safeUntil time.Time   // local clock: the lease is valid until then
	running   bool        // the subscriber is started and not stopping
	stopping  bool        // a stop was requested
	release   bool        // release the lease once stopped
	fence     *time.Timer // stops the subscriber before safeUntil
	stopReq   chan struct{}
	abandon   context.CancelFunc // abandons the subscriber's work
}

// NewGroup returns the ownership group of consumer c: replicas running
// NewGroup with the same consumer name share its cfg.Partitions. The
// consumer's database needs migration 0008 ("idem migrate up").
func NewGroup[TTx any](c *Consumer[TTx], cfg GroupConfig) (*Group, error) {
	leases := c.Driver().Dialect()
	if cfg.Partitions <= 0 {
		return nil, fmt.Errorf("idem: group %s: Partitions %d: set the number of partitions of the consumer's queue (at least 1)", c.Name(), cfg.Partitions)
	}
	if cfg.Subscriber == nil {
		return nil, fmt.Errorf("idem: group %s: Subscriber is required: a function returning the subscriber of one partition", c.Name())
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = GroupHeartbeatDefault
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = GroupLeaseTTLDefault
	}
	if cfg.LeaseTTL < 2*cfg.Heartbeat {
		return nil, fmt.Errorf("idem: group %s: LeaseTTL %v is under twice Heartbeat %v: raise LeaseTTL (3 heartbeats or more)", c.Name(), cfg.LeaseTTL, cfg.Heartbeat)
	}
	if cfg.MemberID == "" {
		cfg.MemberID = defaultMemberID()
	}
	var log *slog.Logger
	if cfg.Logger == nil {
		log = c.log.With("member", cfg.MemberID) // c.log names the consumer
	} else {
		log = cfg.Logger.With("consumer", c.Name(), "member", cfg.MemberID)
	}
	return &Group{
		name:      c.Name(),
		leases:    leases,
		ex:        c.Driver().Pool(),
		cfg:       cfg,
		log:       log,
		dbErrs:    errlog.New(log, "consumer group leases", errlog.Config{}),
		startErrs: errlog.New(log, "consumer group subscribers", errlog.Config{}),
		parts:     map[int]*groupPartition{},
	}, nil
}

// defaultMemberID returns "<hostname>-<pid>-<random>".
func defaultMemberID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "host"
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}

// MemberID returns the member's id in the group.
func (g *Group) MemberID() string { return g.cfg.MemberID }

// Owned returns the partitions whose subscriber runs on this replica
// (started, and not being given up), ascending.
func (g *Group) Owned() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []int
	for n, p := range g.parts {
		if p.running && !p.stopping {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// Start joins the group and starts taking partitions in the background.
// Its context bounds nothing after it returns. It returns an error wrapping
// idem.ErrStarted or idem.ErrStopped when the group was started or stopped
// before; a Stop during Start makes it return idem.ErrStopped.
func (g *Group) Start(ctx context.Context) error {
	if err := g.base.Starting(); err != nil {
		return fmt.Errorf("idem: group %s: %w", g.name, err)
	}
	ctx, cancel := g.base.StartContext(ctx)
	defer cancel()
	// A database without migration 0008 is a set-up error, said now; a
	// database away is not: the loop retries.
	if err := g.leases.HeartbeatMember(ctx, g.ex, g.name, g.cfg.MemberID, g.cfg.LeaseTTL); errors.Is(err, idem.ErrMissingTable) {
		g.base.StartFailed()
		return fmt.Errorf("idem: group %s: %w (the group's tables come with migration 0008: run \"idem migrate up\")", g.name, err)
	}
	if ctx.Err() != nil {
		g.base.StartFailed()
		return fmt.Errorf("idem: group %s: start interrupted: %w", g.name, context.Cause(ctx))
	}
	go func() {
		g.run()
		g.base.Finished()
	}()
	g.base.Running()
	return nil
}

// Stop gives every partition up (each subscriber stopped, settling its
// deliveries in flight, then its lease released) and leaves the group,
// renewing the leases meanwhile, and returns once all that has ended. When
// ctx ends first, the subscribers' work in flight is abandoned and Stop
// returns ctx's error at once; the subscribers then end, release their
// leases and the member leaves the group in the background: Done is closed
// when they have. Stop is idempotent and safe to call from several
// goroutines.
func (g *Group) Stop(ctx context.Context) error {
	return g.base.Stop(ctx, nil, nil)
}

// Done is closed once a started group has stopped (or was stopped before it
// started).
func (g *Group) Done() <-chan struct{} { return g.base.Done() }

// run is the member's loop: a tick every Heartbeat until Stop, then the
// cooperative shutdown.
func (g *Group) run() {
	t := time.NewTicker(g.cfg.Heartbeat)
	defer t.Stop()
	for {
		g.tick(true)
		select {
		case <-g.base.Stopping():
			g.shutdown(t)
			return
		case <-t.C:
		}
		if g.isCrashed() {
			g.wg.Wait()
			return
		}
	}
}

func (g *Group) isCrashed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.crashed
}

// shutdown stops every subscriber cooperatively, renewing the leases until
// they have stopped, then leaves the group.
func (g *Group) shutdown(t *time.Ticker) {
	g.mu.Lock()
	for _, p := range g.parts {
		g.requestStopLocked(p, true, "stopping")
	}
	g.mu.Unlock()
	done := make(chan struct{})
	go func() { g.wg.Wait(); close(done) }()
	for {
		select {
		case <-done:
			if !g.isCrashed() {
				ctx, cancel := context.WithTimeout(context.WithoutCancel(g.base.WorkContext()), g.cfg.LeaseTTL/2)
				if err := g.leases.LeaveGroup(ctx, g.ex, g.name, g.cfg.MemberID); err != nil {
					g.log.Warn("idem: group: could not leave the group; the others wait for the member's lease to expire", "err", err)
				}
				cancel()
			}
			return
		case <-t.C:
			g.tick(false)
		}
	}
}

// stmtCtx bounds one tick's statements (or a release): half a lease. A
// database that answers slowly still renews the leases; one away makes the
// renewal fail, and the fences stop the subscribers in time whatever the
// loop waits for.
func (g *Group) stmtCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(g.base.WorkContext(), g.cfg.LeaseTTL/2)
}

// tick renews the member's lease and its partitions' leases, then, when
// assign is set, gives up the partitions no longer assigned to it and
// takes those newly assigned.
func (g *Group) tick(assign bool) {
	if g.isCrashed() || g.base.WorkContext().Err() != nil {
		return
	}
	ctx, cancel := g.stmtCtx()
	defer cancel()
	// The partitions first, then the member: a member killed after both
	// expires after its partitions, so that the others, seeing it gone,
	// find its partitions free.
	sent := time.Now()
	held := g.held()
	if len(held) > 0 {
		lost, err := g.leases.RenewPartitions(ctx, g.ex, g.name, g.cfg.MemberID, held, g.cfg.LeaseTTL)
		if err != nil {
			g.dbErrs.Warn(ctx, "idem: group: lease renewal failed; the partitions run while their leases last", err)
			return
		}
		g.renewed(held, lost, sent.Add(g.cfg.LeaseTTL))
	}
	if err := g.leases.HeartbeatMember(ctx, g.ex, g.name, g.cfg.MemberID, g.cfg.LeaseTTL); err != nil {
		g.dbErrs.Warn(ctx, "idem: group: heartbeat failed; the partitions run while their leases last", err)
		return
	}
	if !assign {
		g.dbErrs.OK(ctx)
		return
	}
	members, err := g.leases.LiveMembers(ctx, g.ex, g.name)
	if err != nil {
		g.dbErrs.Warn(ctx, "idem: group: reading the members failed", err)
		return
	}
	g.dbErrs.OK(ctx)
	mine := assigned(members, g.cfg.MemberID, g.cfg.Partitions)
	if mine == nil {
		return // our heartbeat is not visible yet: change nothing
	}
	g.mu.Lock()
	for n, p := range g.parts {
		if !mine[n] {
			g.requestStopLocked(p, true, "assigned to another member")
		}
	}
	g.mu.Unlock()
	for n := range g.cfg.Partitions {
		if !mine[n] || g.holds(n) {
			continue
		}
		sent := time.Now()
		l, ok, err := g.leases.AcquirePartition(ctx, g.ex, g.name, g.cfg.MemberID, n, g.cfg.LeaseTTL)
		if err != nil {
			g.dbErrs.Warn(ctx, "idem: group: taking a partition failed", err, "partition", n)
			return
		}
		if ok {
			g.take(n, l.Epoch, sent.Add(g.cfg.LeaseTTL))
		}
	}
}

// assigned returns the partitions of [0, partitions) assigned to member
// among the sorted live members: p goes to members[p mod N]. It returns
// nil when member is not among them.
func assigned(members []string, member string, partitions int) map[int]bool {
	i := slices.Index(members, member)
	if i < 0 {
		return nil
	}
	out := map[int]bool{}
	for p := i; p < partitions; p += len(members) {
		out[p] = true
	}
	return out
}

func (g *Group) held() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]int, 0, len(g.parts))
	for n := range g.parts {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func (g *Group) holds(n int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.parts[n]
	return ok
}

// renewed records a renewal sent before safeUntil-LeaseTTL: the leases of
// held but lost are gone, the others valid until safeUntil.
func (g *Group) renewed(held, lost []int, safeUntil time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, n := range held {
		p := g.parts[n]
		if p == nil {
			continue
		}
		if slices.Contains(lost, n) {
			// Another member may run it already: stop at once, abandon
			// the work in flight, release nothing (it is not ours).
			g.requestStopLocked(p, false, "lease lost")
			p.abandon()
			continue
		}
		if safeUntil.After(p.safeUntil) {
			p.safeUntil = safeUntil
			g.armFenceLocked(p)
		}
	}
}

// armFenceLocked sets p's fence: a Heartbeat before the lease expires,
// the subscriber is stopped; at the expiry, its work is abandoned.
func (g *Group) armFenceLocked(p *groupPartition) {
	at := p.safeUntil.Add(-g.cfg.Heartbeat)
	if p.stopping {
		at = p.safeUntil
	}
	p.fence.Reset(time.Until(at))
}

// onFence runs when p's lease is about to expire without renewal.
func (g *Group) onFence(p *groupPartition) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.parts[p.n] != p {
		return
	}
	left := time.Until(p.safeUntil)
	if left <= 0 {
		p.abandon()
		return
	}
	if !p.stopping {
		g.log.Warn("idem: group: partition lease cannot be renewed before it expires; stopping its subscriber", "partition", p.n)
		g.requestStopLocked(p, true, "lease expiring")
	}
	p.fence.Reset(left)
}

// take records partition n acquired, valid until safeUntil, and starts
// its subscriber.
func (g *Group) take(n int, epoch int64, safeUntil time.Time) {
	ctx, abandon := context.WithCancel(g.base.WorkContext())
	p := &groupPartition{n: n, epoch: epoch, safeUntil: safeUntil, stopReq: make(chan struct{}), abandon: abandon}
	g.mu.Lock()
	p.fence = time.AfterFunc(time.Hour, func() { g.onFence(p) })
	g.armFenceLocked(p)
	g.parts[n] = p
	g.wg.Add(1)
	g.mu.Unlock()
	go g.runPartition(ctx, p)
}

// requestStopLocked asks p's goroutine to stop its subscriber, then to
// release the lease when release is set.
func (g *Group) requestStopLocked(p *groupPartition, release bool, why string) {
	if p.stopping {
		if !release {
			p.release = false
		}
		return
	}
	p.stopping = true
	p.release = release
	close(p.stopReq)
	g.armFenceLocked(p)
	g.log.Info("idem: group: giving a partition up", "partition", p.n, "epoch", p.epoch, "reason", why)
}

// runPartition starts p's subscriber, waits for a stop request, stops it,
// then releases the lease.
func (g *Group) runPartition(ctx context.Context, p *groupPartition) {
	defer g.wg.Done()
	defer p.abandon()
	sub, err := g.cfg.Subscriber(p.n)
	if err == nil && sub == nil {
		err = errors.New("GroupConfig.Subscriber returned no subscriber and no error")
	}
	if err == nil {
		g.mu.Lock()
		startCtx, cancel := context.WithDeadline(ctx, p.safeUntil)
		g.mu.Unlock()
		err = sub.Start(startCtx)
		cancel()
		if err != nil {
			// A failed Start leaves nothing running; Stop is harmless.
			_ = sub.Stop(ctx)
			sub = nil
		}
	}
	if err != nil {
		g.startErrs.Error(ctx, "idem: group: starting a partition's subscriber failed; the partition is released and taken again at a later heartbeat",
			err, "partition", p.n)
		g.mu.Lock()
		g.requestStopLocked(p, true, "start failed")
		g.mu.Unlock()
	} else {
		g.mu.Lock()
		p.running = true
		g.mu.Unlock()
		g.startErrs.OK(ctx)
		g.log.Info("idem: group: took a partition", "partition", p.n, "epoch", p.epoch)
	}
	<-p.stopReq
	if sub != nil {
		if err := sub.Stop(ctx); err != nil {
			g.log.Warn("idem: group: a partition's subscriber stopped abandoning its work in flight", "partition", p.n, "err", err)
			// Its work ends in the background: the lease is released
			// once it has, when the subscriber tells (idem's do).
			if d, ok := sub.(interface{ Done() <-chan struct{} }); ok {
				<-d.Done()
			}
		}
	}
	g.mu.Lock()
	p.running = false
	p.fence.Stop()
	release := p.release && !g.crashed
	g.mu.Unlock()
	if release {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(g.base.WorkContext()), g.cfg.LeaseTTL/2)
		if _, err := g.leases.ReleasePartition(rctx, g.ex, g.name, g.cfg.MemberID, p.n); err != nil {
			g.log.Warn("idem: group: releasing a partition failed; the others take it when its lease expires", "partition", p.n, "err", err)
		}
		cancel()
	}
	g.mu.Lock()
	if g.parts[p.n] == p {
		delete(g.parts, p.n)
	}
	g.mu.Unlock()
}

// crash simulates, for tests, a replica killed: its subscribers are
// stopped abandoning their work, nothing is released, the member does not
// leave, and heartbeats stop. The leases expire on their own.
func (g *Group) crash() {
	g.mu.Lock()
	g.crashed = true
	for _, p := range g.parts {
		g.requestStopLocked(p, false, "crash")
		p.abandon()
	}
	g.mu.Unlock()
}
