package main

import (
	"cmp"
	"context"
	"debug/buildinfo"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/ctxsleep"
	"github.com/idem-go/idem/internal/registry"
	"github.com/idem-go/idem/internal/tools/shopkit"
	"github.com/idem-go/idem/relay"
	"github.com/idem-go/idem/shop/store"
)

// randomOptions configure a random-kill run (shopctl chaos --random).
type randomOptions struct {
	Binary, DB, Broker string
	// Relay and Outbox are every process's --relay and --outbox ("" for
	// the defaults).
	Relay, Outbox string
	// Replicas is how many processes run each consumer service (stock,
	// shipping, billing), the relays and the order API: replicas of one
	// consumer share its name, queue or durable consumer.
	Replicas int
	// Partitions, when set, partitions each consumer's queue (RabbitMQ)
	// or the stream (NATS): the replicas of a consumer then share its
	// partitions instead of standing by.
	Partitions int
	// BrokerDir, when set, has runRandom run the broker itself, as a
	// process (shop broker) with its data in BrokerDir, and fault it too;
	// Broker is then ignored.
	BrokerDir string
	// Servers are servers of the run's own (a database, a broker node)
	// that it faults too, with the shop's processes.
	Servers []serverTarget
	// Duration is how long faults are made while orders are placed.
	Duration time.Duration
	// Rate is the orders per second placed meanwhile.
	Rate float64
	// KillMin and KillMax bound the random wait before each fault.
	KillMin, KillMax time.Duration
	// FreezeMin and FreezeMax bound how long a frozen process stays
	// frozen (SIGSTOP, then SIGCONT); 0 makes no freeze.
	FreezeMin, FreezeMax time.Duration
	// MinFaults and MinRounds, when set, keep making faults past Duration
	// until that many are done, and every target (every process, every
	// server) was hit that many times.
	MinFaults, MinRounds int
	// Seed makes the schedule of faults repeatable.
	Seed uint64
	// Settle bounds the wait for every effect once the faults stop.
	Settle time.Duration
	// NoReplay leaves out the replay, halfway through the run, of the
	// events applied by every consumer (a third source of duplicates,
	// after the relays' republishing and the brokers' redeliveries).
	NoReplay bool
	// Strict counts a check that could not run as a failure.
	Strict bool
	// KeepFailed keeps the run's namespace (its schemas and databases)
	// when a check fails, for a look; randomReport.Kept names it.
	KeepFailed bool
	// KeepData is set by the caller that keeps the embedded defaults'
	// directory.
	KeepData bool
	// ExtraEnv is added to every shop process's environment.
	ExtraEnv []string
	// LogDir receives each process's log.
	LogDir string
	// Progress, when set, receives a line every 10 seconds and one per
	// phase.
	Progress io.Writer
}

// randomDefaults are the settings of a random-kill run that its flags
// leave out.
var randomDefaults = randomOptions{Rate: 30, Replicas: 2, KillMin: 500 * time.Millisecond, KillMax: 4 * time.Second,
	FreezeMin: 2500 * time.Millisecond, FreezeMax: 5 * time.Second, Settle: 2 * time.Minute}

// serverTarget is a server of the run's own that it faults: a database
// server or a node of the broker's cluster.
type serverTarget struct {
	// Name names it in the faults' list ("postgres", "rabbitmq node 2").
	Name string
	// Crash kills it with SIGKILL and starts it again, waiting until it
	// serves; it returns what it did, for the list. Nil when it cannot.
	Crash func(ctx context.Context) (string, error)
	// Freeze and Thaw stop it with SIGSTOP and resume it; nil when it
	// cannot be frozen.
	Freeze, Thaw func() error
	// Hold holds its commits for d after their log record is flushed
	// (shopkit.DBServer.HoldCommits); nil when it cannot.
	Hold func(ctx context.Context, d time.Duration) (string, error)
}

// serverDB returns the faults of a database server of the run's own.
func serverDB(s *shopkit.DBServer) serverTarget {
	return serverTarget{Name: s.Name(), Crash: s.Crash, Freeze: s.Freeze, Thaw: s.Thaw, Hold: s.HoldCommits}
}

// randomReport is the outcome of a random-kill run.
type randomReport struct {
	Options randomOptions
	// Accepted counts the orders answered 201; Requests, every POST sent;
	// GaveUp, the orders whose every attempt failed until the end;
	// Cancelled, the accepted orders cancelled then; CancelsGaveUp, the
	// cancellations whose every attempt failed until the end (the order
	// stays placed).
	Accepted, Requests, GaveUp, Cancelled, CancelsGaveUp int
	// Faults are the faults made, in order.
	Faults []faultRecord
	// Replayed counts the events published again halfway through.
	Replayed int64
	// Checks are the verdict, one row each.
	Checks []shopkit.Check
	// Kept names the namespace kept (Options.KeepFailed).
	Kept string
}

// faultRecord is one fault of a run.
type faultRecord struct {
	// At is when it was made, from the start of the faults.
	At time.Duration
	// Kind is "kill", "freeze", "crash" (a server killed and started
	// again), "hold" (a server's commits held before they are visible),
	// "replay" (events published again) or "died" (a process that ended
	// on its own, started again).
	Kind string
	// Target names what was faulted.
	Target string
	// For is how long a freeze lasted, or a crashed server took to serve
	// again.
	For time.Duration
	// Note says more, when there is more to say.
	Note string
}

// failed returns the rows that did not pass: failures, and with Strict the
// checks that could not run.
func (r randomReport) failed() int {
	n := 0
	for _, c := range r.Checks {
		if !c.OK && (!c.NotRun || r.Options.Strict) {
			n++
		}
	}
	return n
}

// faultCounts counts the faults per kind and target, for the summary.
func (r randomReport) faultCounts() (byKind map[string]int, byTarget map[string]int) {
	byKind, byTarget = map[string]int{}, map[string]int{}
	for _, f := range r.Faults {
		byKind[f.Kind]++
		byTarget[f.Target]++
	}
	return byKind, byTarget
}

// randomProcess is a process of a random-kill run.
type randomProcess struct {
	name  string
	start func(ctx context.Context) (*shopkit.Proc, error)

	mu     sync.Mutex
	p      *shopkit.Proc
	frozen bool
}

// replicaName names the i-th (from 1) of n replicas of a service.
func replicaName(service string, i, n int) string {
	if n == 1 {
		return service
	}
	return fmt.Sprintf("%s-%d", service, i)
}

// faultTarget is what one fault hits: a shop process (or the broker
// process), or a server of the run's own.
type faultTarget struct {
	proc   *randomProcess
	server *serverTarget
}

func (t faultTarget) name() string {
	if t.proc != nil {
		return t.proc.name
	}
	return t.server.Name
}

// faults makes the faults of a run: it picks the targets in rounds, each
// round a random permutation of every target, so that every process (the
// relay that holds the log's slot, say) is faulted once per round. A
// target frozen still is skipped.
type faults struct {
	o       randomOptions
	rng     *rand.Rand
	start   time.Time
	targets []faultTarget
	round   []int
	rounds  int // rounds done
	hits    map[string]int
	ctx     context.Context

	mu      sync.Mutex
	records []faultRecord
	thaws   sync.WaitGroup
	err     error // the first error of a restart
}

func (f *faults) record(r faultRecord) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.records = append(f.records, r)
}

func (f *faults) recorded() []faultRecord {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.records)
}

func (f *faults) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.records)
}

func (f *faults) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
	}
}

func (f *faults) failed() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// next returns the next target of the current round, drawing a new round
// when it is done.
func (f *faults) next() faultTarget {
	if len(f.round) == 0 {
		f.round = f.rng.Perm(len(f.targets))
	}
	t := f.targets[f.round[0]]
	f.round = f.round[1:]
	if len(f.round) == 0 {
		f.rounds++
	}
	return t
}

// hit makes one fault on t: a kill (with a restart at once) or a freeze
// (thawed later, in the background) of a process; a crash, a freeze or a
// hold of a server. The first fault of each target is a kill (a crash),
// so that every process of a run (the broker, the relay that holds the
// slot) is killed at least once when every target is hit.
func (f *faults) hit(t faultTarget) {
	at := time.Since(f.start)
	f.hits[t.name()]++
	first := f.hits[t.name()] == 1
	freeze := !first && f.o.FreezeMax > 0 && f.rng.IntN(3) == 0
	d := f.o.FreezeMin + time.Duration(f.rng.Int64N(int64(f.o.FreezeMax-f.o.FreezeMin)+1))
	if f.o.FreezeMax == 0 {
		d = randomDefaults.FreezeMin // a server's freeze or hold
	}
	if rp := t.proc; rp != nil {
		rp.mu.Lock()
		defer rp.mu.Unlock()
		if rp.frozen {
			return
		}
		if freeze {
			rp.frozen = true
			p := rp.p
			p.Freeze()
			f.record(faultRecord{At: at, Kind: "freeze", Target: rp.name, For: d})
			f.thaws.Go(func() {
				ctxsleep.Sleep(f.ctx, d)
				rp.mu.Lock()
				defer rp.mu.Unlock()
				p.Thaw()
				rp.frozen = false
			})
			return
		}
		rp.p.Kill()
		f.record(faultRecord{At: at, Kind: "kill", Target: rp.name})
		var err error
		if rp.p, err = rp.start(f.ctx); err != nil {
			f.fail(fmt.Errorf("restart %s after its kill: %w", rp.name, err))
		}
		return
	}
	s := t.server
	var kinds []string
	if s.Crash != nil {
		kinds = append(kinds, "crash")
	}
	if s.Freeze != nil {
		kinds = append(kinds, "freeze")
	}
	if s.Hold != nil {
		kinds = append(kinds, "hold")
	}
	if len(kinds) == 0 {
		return
	}
	// A server's fault ends before the next one starts: its processes
	// are not the run's to track.
	kind := kinds[f.rng.IntN(len(kinds))]
	if first {
		kind = kinds[0]
	}
	switch kind {
	case "freeze":
		if err := s.Freeze(); err != nil {
			f.fail(fmt.Errorf("freeze %s: %w", s.Name, err))
			return
		}
		f.record(faultRecord{At: at, Kind: kind, Target: s.Name, For: d})
		ctxsleep.Sleep(f.ctx, d)
		if err := s.Thaw(); err != nil {
			f.fail(fmt.Errorf("thaw %s: %w", s.Name, err))
		}
	case "hold":
		note, err := s.Hold(f.ctx, d)
		f.record(faultRecord{At: at, Kind: "hold", Target: s.Name, For: d, Note: note})
		if err != nil {
			f.fail(fmt.Errorf("hold the commits of %s: %w", s.Name, err))
		}
	default:
		began := time.Now()
		note, err := s.Crash(f.ctx)
		f.record(faultRecord{At: at, Kind: kind, Target: s.Name, For: time.Since(began), Note: note})
		if err != nil {
			f.fail(fmt.Errorf("crash %s: %w", s.Name, err))
		}
	}
}

// supervise starts again, as a supervisor would, every process that ended
// with nobody ending it, recording it as a fault of kind "died" (the
// verdict fails on it), until ctx ends.
func (f *faults) supervise(ctx context.Context, procs []*randomProcess) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, rp := range procs {
			rp.mu.Lock()
			if rp.p != nil && rp.p.Death() != "" {
				f.record(faultRecord{At: time.Since(f.start), Kind: "died", Target: rp.name, Note: "ended on its own; started again"})
				var err error
				if rp.p, err = rp.start(f.ctx); err != nil {
					f.fail(fmt.Errorf("restart %s after it died: %w", rp.name, err))
				}
			}
			rp.mu.Unlock()
		}
	}
}

// runRandom starts the shop as separate processes (the order API with the
// carrier, stock, shipping, billing, the relays, o.Replicas of each but the
// carrier; and the broker with o.BrokerDir) in a namespace of its own,
// places orders at o.Rate, each retried with its Idempotency-Key until it
// is accepted (every fourth cancelled once accepted), and for o.Duration
// makes a fault every o.KillMin to o.KillMax: a SIGKILL of a process,
// started again at once, or a freeze (SIGSTOP, SIGCONT after FreezeMin to
// FreezeMax, meanwhile the next faults go on), or a crash or freeze of one
// of o.Servers; halfway through (or, when no event is applied everywhere
// yet, at a later fault, the run longer by as much), it publishes again
// the events every consumer applied. Then it waits for every effect (a sentinel order
// last) and checks, from the databases and the logs and not from the
// services' counters: every accepted order's effects, cancellations
// included (State.Verdict); from the consumers' application ledgers, every
// event of every outbox applied exactly once by each consumer subscribed to
// it, in aggregate-version order; nothing parked by a consumer nor
// quarantined by a relay; every invoice marked e-mailed; no event met
// before its row was visible; no process that died on its own, and no race
// report.
func runRandom(ctx context.Context, o randomOptions) (rep randomReport, _ error) {
	rep = randomReport{Options: o}
	ns := "random_" + shopkit.RandomSuffix()
	cl := &shopkit.Cluster{Binary: o.Binary, DB: o.DB, Broker: o.Broker, Namespace: ns, LogDir: o.LogDir, Relay: o.Relay, Outbox: o.Outbox, ExtraEnv: o.ExtraEnv}
	in, err := shopkit.OpenInspector(ctx, o.DB, ns)
	if err != nil {
		return rep, err
	}
	defer in.Close()
	defer func() {
		cl.StopAll()
		if o.KeepFailed && rep.failed() > 0 {
			rep.Kept = ns
			return
		}
		in.DropNamespace()
	}()

	var procs []*randomProcess
	if o.BrokerDir != "" {
		listen, err := shopkit.FreeAddr()
		if err != nil {
			return rep, err
		}
		// A short ack_wait has a killed consumer's messages delivered
		// again soon.
		cl.Broker = "nats://" + listen + "?ack_wait=3s"
		rep.Options.Broker = cl.Broker
		args := []string{"broker", "--data-dir", o.BrokerDir, "--listen", listen}
		procs = append(procs, &randomProcess{name: "broker", start: func(ctx context.Context) (*shopkit.Proc, error) {
			return cl.Run(ctx, "broker", "", "", args)
		}})
	}
	if o.Partitions > 0 {
		sep := "?"
		if strings.Contains(cl.Broker, "?") {
			sep = "&"
		}
		cl.Broker += fmt.Sprintf("%spartitions=%d", sep, o.Partitions)
		rep.Options.Broker = cl.Broker
	}
	replicas := max(o.Replicas, 1)
	fronts := make([]string, replicas)
	for i := range fronts {
		if fronts[i], err = shopkit.FreeAddr(); err != nil {
			return rep, err
		}
	}
	in.API = fronts[0]
	carrierURL := "http://" + fronts[0] + "/carrier"
	service := func(spec shopkit.ProcSpec) *randomProcess {
		return &randomProcess{name: spec.Name, start: func(ctx context.Context) (*shopkit.Proc, error) {
			return cl.Start(ctx, spec)
		}}
	}
	// The consumers declare their queues before the relays publish.
	procs = append(procs, service(shopkit.ProcSpec{Name: "order+carrier", Services: "order,carrier", HTTP: fronts[0]}))
	for i := 2; i <= replicas; i++ {
		procs = append(procs, service(shopkit.ProcSpec{Name: replicaName("order", i, replicas), Services: "order", HTTP: fronts[i-1]}))
	}
	for _, s := range []string{"stock", "shipping", "billing", "relay"} {
		for i := 1; i <= replicas; i++ {
			procs = append(procs, service(shopkit.ProcSpec{Name: replicaName(s, i, replicas), Services: s, CarrierURL: carrierURL}))
		}
	}
	for _, rp := range procs {
		if rp.p, err = rp.start(ctx); err != nil {
			return rep, err
		}
	}
	progress := func(format string, args ...any) {
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "chaos --random: "+format+"\n", args...)
		}
	}
	var serverNames []string
	for _, s := range o.Servers {
		serverNames = append(serverNames, s.Name)
	}
	progress("%s of faults every %v-%v at %.0f orders/s; processes: %s; servers: %s", o.Duration, o.KillMin, o.KillMax, o.Rate, procNames(procs), cmp.Or(strings.Join(serverNames, ", "), "none of the run's own"))

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	ld := &randomLoad{addrs: fronts, client: &http.Client{Timeout: 10 * time.Second}}
	defer ld.client.CloseIdleConnections()
	// New orders are placed until the faults stop; each is retried until
	// accepted, or until the settle time has passed after the faults.
	faultsDone := make(chan struct{})
	var giveUp atomic.Int64
	giveUp.Store(time.Now().Add(o.Duration + o.Settle).UnixNano())
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		ld.run(runCtx, o.Rate, faultsDone, &giveUp)
	}()

	f := &faults{o: o, rng: rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15)), start: time.Now(), ctx: ctx, hits: map[string]int{}}
	for _, rp := range procs {
		f.targets = append(f.targets, faultTarget{proc: rp})
	}
	for i := range o.Servers {
		f.targets = append(f.targets, faultTarget{server: &o.Servers[i]})
	}
	superCtx, stopSupervising := context.WithCancel(ctx)
	superDone := make(chan struct{})
	go func() {
		defer close(superDone)
		f.supervise(superCtx, procs)
	}()
	nextReport := f.start.Add(10 * time.Second)
	replayed := o.NoReplay
	var runErr error
	for step := 1; runErr == nil; step++ {
		wait := o.KillMin + time.Duration(f.rng.Int64N(int64(o.KillMax-o.KillMin)+1))
		if time.Since(f.start)+wait >= o.Duration && f.count() >= o.MinFaults && f.rounds >= o.MinRounds && replayed {
			break
		}
		if !ctxsleep.Sleep(ctx, wait) {
			runErr = ctx.Err()
			break
		}
		f.hit(f.next())
		if step%5 == 0 {
			// Two faults at once (a freeze may be going on too).
			f.hit(f.next())
		}
		if !replayed && time.Since(f.start) >= o.Duration/2 {
			// Once some events are applied everywhere: on a slow start,
			// at a later fault, the faults going on until then (up to
			// the settle time past the run's duration).
			n, note, done := replayApplied(ctx, in, cl.Broker, ns, f.start)
			if done || time.Since(f.start) >= o.Duration+o.Settle {
				replayed = true
				rep.Replayed = n
				f.record(faultRecord{At: time.Since(f.start), Kind: "replay", Target: "every outbox", Note: note})
			}
		}
		runErr = f.failed()
		if time.Now().After(nextReport) {
			nextReport = nextReport.Add(10 * time.Second)
			progress("%v: %d orders accepted, %d faults", time.Since(f.start).Round(time.Second), ld.accepted.Load(), f.count())
		}
	}
	if runErr == nil {
		ctxsleep.Sleep(ctx, o.Duration-time.Since(f.start))
	}
	f.thaws.Wait()
	giveUp.Store(time.Now().Add(o.Settle).UnixNano())
	close(faultsDone)
	progress("faults stopped after %v (%d); waiting for the orders in flight", time.Since(f.start).Round(time.Second), f.count())
	<-loadDone
	rep.Accepted, rep.Requests, rep.GaveUp = int(ld.accepted.Load()), int(ld.requests.Load()), int(ld.gaveUp.Load())
	rep.Cancelled = int(ld.cancelled.Load())
	rep.CancelsGaveUp = int(ld.cancelsGivenUp.Load())
	if n := ld.cancelsRefused.Load(); n > 0 {
		rep.Checks = append(rep.Checks, shopkit.Check{What: "no cancellation of an accepted order refused", Observed: fmt.Sprintf("%d cancellations refused; last: %s", n, ld.lastRefusal.Load())})
	}
	if runErr != nil {
		stopSupervising()
		<-superDone
		rep.Faults = f.recorded()
		return rep, runErr
	}
	progress("%d orders accepted (%d requests, %d gave up); waiting for every effect", rep.Accepted, rep.Requests, rep.GaveUp)

	want := rep.Accepted
	if rep.GaveUp > 0 {
		want = -1 // an order given up may or may not exist
	}
	rep.Checks = append(rep.Checks, in.SettleChecks(ctx, o.Settle, want)...)
	stopSupervising()
	<-superDone
	rep.Faults = f.recorded()
	s, err := in.State(ctx)
	if err != nil {
		return rep, err
	}
	rep.Checks = append(rep.Checks, ld.checkOrders(s, rep.GaveUp, in.Sentinels()))
	left, err := in.Leftovers(ctx)
	if err != nil {
		return rep, err
	}
	rep.Checks = append(rep.Checks, left...)
	cl.StopAll()
	logs, err := shopkit.ScanLogs(o.LogDir)
	if err != nil {
		return rep, err
	}
	race, visible := logs.Checks()
	if !raceBuild(o.Binary) {
		race.NotRun, race.Observed = true, "the shop is not built with -race: nothing to report"
	}
	rep.Checks = append(rep.Checks, race, visible)
	deaths := shopkit.Check{What: "no process died on its own (every end was a fault of the run)", OK: true, Observed: "0 deaths"}
	if d := cl.Deaths(); len(d) > 0 {
		deaths.OK, deaths.Observed = false, fmt.Sprintf("%d processes died on their own: %s", len(d), strings.Join(d, " | "))
	}
	rep.Checks = append(rep.Checks, deaths)
	return rep, nil
}

// replayApplied publishes again, as "idem replay" would, the events of
// every outbox written since since that every consumer subscribed to them
// has applied: pure duplicates, whatever their order, which each consumer
// must skip. It returns how many it published, and what happened; done is
// false, and nothing is published, while no event is applied everywhere.
func replayApplied(ctx context.Context, in *shopkit.Inspector, brokerURL, ns string, since time.Time) (_ int64, note string, done bool) {
	applied, err := in.AppliedEverywhere(ctx)
	if err != nil {
		return 0, "not done: " + err.Error(), true
	}
	if len(applied) == 0 {
		return 0, "not done: no event applied by every consumer subscribed to it yet", false
	}
	var total int64
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range []string{"order", "shipping", "billing"} {
		for {
			n, err := replayOnly(ctx, in.DBs[s], brokerURL, ns, applied, since)
			if err == nil {
				total += n
				break
			}
			if time.Now().After(deadline) || !ctxsleep.Sleep(ctx, 500*time.Millisecond) {
				return total, fmt.Sprintf("%d events published again, then: %v", total, err), true
			}
		}
	}
	return total, fmt.Sprintf("%d events applied everywhere published again (duplicate source 3)", total), true
}

// replayOnly replays db's outbox since since, publishing only the events
// in ids.
func replayOnly(ctx context.Context, db *store.DB, brokerURL, ns string, ids map[string]bool, since time.Time) (int64, error) {
	pub, err := registry.OpenPrefixed(ctx, brokerURL, ns)
	if err != nil {
		return 0, err
	}
	defer pub.Close()
	fp := &filtering{Publisher: pub, keep: ids}
	_, err = relay.Replay(ctx, db.Driver, fp, relay.ReplayFilter{Since: since}, relay.ReplayOptions{})
	return fp.published.Load(), err
}

// filtering publishes only the messages whose event id it keeps. Replay
// calls Publish from several goroutines at once.
type filtering struct {
	registry.Publisher
	keep      map[string]bool
	published atomic.Int64
}

func (f *filtering) Publish(ctx context.Context, msgs []idem.Message) error {
	var out []idem.Message
	for _, m := range msgs {
		if f.keep[m.EventID.String()] {
			out = append(out, m)
		}
	}
	if len(out) == 0 {
		return nil
	}
	if err := f.Publisher.Publish(ctx, out); err != nil {
		return err
	}
	f.published.Add(int64(len(out)))
	return nil
}

// raceBuild reports whether the binary at path was built with the race
// detector.
func raceBuild(path string) bool {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return false
	}
	for _, s := range info.Settings {
		if s.Key == "-race" && s.Value == "true" {
			return true
		}
	}
	return false
}

func procNames(procs []*randomProcess) string {
	names := make([]string, len(procs))
	for i, rp := range procs {
		names[i] = rp.name
	}
	return strings.Join(names, ", ")
}

// randomLoad places orders through the order API, each with an
// Idempotency-Key of its own, and retries each with the same key, as a
// client whose request failed or timed out would, until it is accepted.
type randomLoad struct {
	// addrs are the order API's replicas; each request goes to the next.
	addrs  []string
	client *http.Client
	next   atomic.Uint64

	accepted, requests, gaveUp atomic.Int64
	// cancelled counts the accepted cancellations; cancelsGivenUp, those
	// whose every attempt failed until the end by a fault (no answer, a
	// 5xx, a 409): the order stays placed, which the checks of its effects
	// read from the database; cancelsRefused, those the API refused (a 404
	// for an accepted order), which fail the run.
	cancelled, cancelsGivenUp, cancelsRefused atomic.Int64
	lastRefusal                               atomic.Value // string
	mu                                        sync.Mutex
	orders                                    map[string]bool // the ids of the accepted orders
}

// run places orders at rate until stop is closed, then waits for those in
// flight: each is retried until accepted or until giveUp (unix nanoseconds).
func (l *randomLoad) run(ctx context.Context, rate float64, stop <-chan struct{}, giveUp *atomic.Int64) {
	l.orders = map[string]bool{}
	t := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer t.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for n := 0; ; n++ {
		select {
		case <-t.C:
		case <-stop:
			return
		case <-ctx.Done():
			return
		}
		// Every fourth order is cancelled once accepted, so that the
		// order and preparation aggregates get several events, whose
		// order the consumers must keep.
		wg.Go(func() { l.place(ctx, fmt.Sprintf("c-%d", n), 1+n%3, n%4 == 3, giveUp) })
	}
}

// place places one order until it is accepted or giveUp passes, then,
// with cancel, cancels it until the cancellation is accepted.
func (l *randomLoad) place(ctx context.Context, customer string, lines int, cancel bool, giveUp *atomic.Int64) {
	key := uuid.NewString()
	for backoff := 50 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
		l.requests.Add(1)
		addr := l.addrs[l.next.Add(1)%uint64(len(l.addrs))]
		r, err := shopkit.PlaceOrderWith(ctx, l.client, addr, key, customer, lines)
		if err == nil && r.Status == http.StatusCreated && r.ID != "" {
			l.mu.Lock()
			l.orders[r.ID] = true
			l.mu.Unlock()
			l.accepted.Add(1)
			if cancel {
				l.cancel(ctx, r.ID, giveUp)
			}
			return
		}
		// A refused connection (the API restarting), a 5xx (its database
		// or a dependency away), a 409 (the key's first request still
		// running): the same request again, with the same key.
		if time.Now().UnixNano() > giveUp.Load() || !ctxsleep.Sleep(ctx, backoff) {
			l.gaveUp.Add(1)
			return
		}
	}
}

// cancel cancels an accepted order, through the order API's replicas in
// turn, until a cancellation is accepted or giveUp passes.
func (l *randomLoad) cancel(ctx context.Context, id string, giveUp *atomic.Int64) {
	for backoff := 50 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
		addr := l.addrs[l.next.Add(1)%uint64(len(l.addrs))]
		cctx, done := context.WithTimeout(ctx, 10*time.Second)
		err := shopkit.PostJSON(cctx, "http://"+addr+"/orders/"+id+"/cancel", struct{}{})
		done()
		if err == nil {
			l.cancelled.Add(1)
			return
		}
		if shopkit.Refused(err) {
			l.cancelsRefused.Add(1)
			l.lastRefusal.Store(err.Error())
			return
		}
		if time.Now().UnixNano() > giveUp.Load() || !ctxsleep.Sleep(ctx, backoff) {
			l.cancelsGivenUp.Add(1)
			return
		}
	}
}

// checkOrders compares the orders in the database with those accepted
// (the sentinel orders of the settle included):
// each accepted order exists, and, when no order was given up, no other.
func (l *randomLoad) checkOrders(s shopkit.State, gaveUp int, sentinels []string) shopkit.Check {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range sentinels {
		l.orders[id] = true
	}
	var missing, extra []string
	for id := range l.orders {
		if s.Orders[id] == nil {
			missing = append(missing, id)
		}
	}
	for id := range s.Orders {
		if !l.orders[id] {
			extra = append(extra, id)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	c := shopkit.Check{What: "every accepted order committed, and no order for a request never accepted"}
	switch {
	case len(missing) > 0:
		c.Observed = fmt.Sprintf("%d accepted orders missing from the database (first: %s)", len(missing), missing[0])
	case len(extra) > 0 && gaveUp == 0:
		c.Observed = fmt.Sprintf("%d orders in the database that no request was answered with (first: %s)", len(extra), extra[0])
	default:
		c.OK = true
		c.Observed = fmt.Sprintf("%d orders accepted, %d in the database (the sentinel's included)", len(l.orders), len(s.Orders))
		if gaveUp > 0 {
			c.Observed += fmt.Sprintf(" (%d requests given up, %d of them committed)", gaveUp, len(extra))
		}
	}
	return c
}

// printRandom writes the report of a random-kill run: the run, every
// fault it made and when, and the verdict.
func printRandom(w io.Writer, r randomReport) {
	o := r.Options
	stack := schemeOf(o.DB) + " + " + schemeOf(o.Broker)
	relayMode := cmp.Or(o.Relay, shopkit.RelayPoll)
	if o.Outbox != "" {
		relayMode += ", outbox " + o.Outbox
	}
	parts := "unpartitioned"
	if o.Partitions > 0 {
		parts = fmt.Sprintf("%d partitions", o.Partitions)
	}
	fmt.Fprintf(w, "random faults: %v on %s, relay %s, %d replica(s) of each service, %s, seed %d\n", o.Duration, stack, relayMode, max(o.Replicas, 1), parts, o.Seed)
	fmt.Fprintf(w, "orders: %d accepted, %d requests (%d retried), %d given up, %d cancelled (%d cancellations given up)\n", r.Accepted, r.Requests, r.Requests-r.Accepted-r.GaveUp, r.GaveUp, r.Cancelled, r.CancelsGaveUp)
	byKind, byTarget := r.faultCounts()
	fmt.Fprintf(w, "faults: %d (%s); by target: %s\n", len(r.Faults), countList(byKind), countList(byTarget))
	for _, f := range r.Faults {
		line := fmt.Sprintf("  %8s  %-6s %s", f.At.Round(10*time.Millisecond), f.Kind, f.Target)
		if f.For > 0 {
			line += fmt.Sprintf(" for %v", f.For.Round(10*time.Millisecond))
		}
		if f.Note != "" {
			line += ": " + f.Note
		}
		fmt.Fprintln(w, line)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tOBSERVED\tRESULT")
	for _, c := range r.Checks {
		status := "pass"
		switch {
		case c.NotRun:
			status = "not run"
		case !c.OK:
			status = "FAIL"
		}
		obs := strings.ReplaceAll(c.Observed, "\n", " ")
		if len(obs) > 400 {
			obs = obs[:400] + "..."
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.What, obs, status)
	}
	_ = tw.Flush()
}

// countList writes counts as "a 3, b 1", sorted by name.
func countList(m map[string]int) string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.Sort(names)
	var out []string
	for _, n := range names {
		out = append(out, fmt.Sprintf("%s %d", n, m[n]))
	}
	return strings.Join(out, ", ")
}

// schemeOf returns the scheme of a URL: "postgres", "amqp", "sqlite"...
func schemeOf(u string) string {
	scheme, _, _ := strings.Cut(u, ":")
	return scheme
}

// check refuses flags that make no sense, and draws a seed when none is
// given. fs tells which flags were set.
func (o *randomOptions) check(dbURL string, fs *flag.FlagSet) error {
	if o.Duration == 0 {
		var only []string
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "rate", "kill-min", "kill-max", "freeze-min", "freeze-max", "strict", "no-replay", "db-start", "seed", "settle", "relay", "outbox", "replicas", "partitions":
				only = append(only, "--"+f.Name)
			}
		})
		if len(only) > 0 {
			return fmt.Errorf("%s apply to random kills only: add --random DURATION (e.g. --random 2m)", strings.Join(only, ", "))
		}
		return nil
	}
	switch {
	case o.Duration < 0:
		return fmt.Errorf("--random %v: want a positive duration, such as 2m", o.Duration)
	case o.Rate <= 0:
		return fmt.Errorf("--rate %v: want a positive number of orders per second", o.Rate)
	case o.KillMin <= 0 || o.KillMax < o.KillMin:
		return fmt.Errorf("--kill-min %v, --kill-max %v: want 0 < --kill-min <= --kill-max", o.KillMin, o.KillMax)
	case o.Settle <= 0:
		return fmt.Errorf("--settle %v: want a positive duration", o.Settle)
	case o.Partitions < 0 || o.Partitions > 64:
		return fmt.Errorf("--partitions %d: want 0 (unpartitioned) to 64", o.Partitions)
	case o.Partitions > 0 && strings.HasPrefix(o.Broker, "kafka:"):
		return errors.New("--partitions: Kafka partitions its topics by itself; drop --partitions")
	case o.Replicas < 1 || o.Replicas > 5:
		return fmt.Errorf("--replicas %d: want 1 to 5 processes of each service", o.Replicas)
	case o.Relay != "" && o.Relay != shopkit.RelayPoll && o.Relay != shopkit.RelayCDC:
		return fmt.Errorf("--relay %q: want %q or %q", o.Relay, shopkit.RelayPoll, shopkit.RelayCDC)
	case o.Relay == shopkit.RelayCDC && !isPostgresURL(dbURL) && !isMariaDBURL(dbURL):
		return errors.New("--relay cdc reads PostgreSQL's write-ahead log or MariaDB's binary log: give --db postgres://... or mysql://... (and --broker)")
	case o.Outbox == shopkit.OutboxLog && !isPostgresURL(dbURL):
		return errors.New("--outbox log writes events as PostgreSQL WAL messages: give --db postgres://<user>@<host>/<database>")
	case o.FreezeMax != 0 && (o.FreezeMin <= 0 || o.FreezeMax < o.FreezeMin):
		return fmt.Errorf("--freeze-min %v, --freeze-max %v: want 0 < --freeze-min <= --freeze-max, or --freeze-max 0 for no freeze", o.FreezeMin, o.FreezeMax)
	case o.Outbox != "" && o.Outbox != shopkit.OutboxRows && o.Outbox != shopkit.OutboxLog:
		return fmt.Errorf("--outbox %q: want %q or %q", o.Outbox, shopkit.OutboxRows, shopkit.OutboxLog)
	case o.Outbox == shopkit.OutboxLog && o.Relay != shopkit.RelayCDC:
		return errors.New("--outbox log writes events as WAL messages, which only --relay cdc reads")
	}
	if o.Seed == 0 {
		o.Seed = rand.Uint64()
	}
	return nil
}
