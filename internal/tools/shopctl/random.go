package main

import (
	"cmp"
	"context"
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

	"github.com/idem-go/idem/internal/ctxsleep"
	"github.com/idem-go/idem/internal/tools/shopkit"
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
	// process (shop broker) with its data in BrokerDir, and kill it too;
	// Broker is then ignored.
	BrokerDir string
	// Duration is how long processes are killed while orders are placed.
	Duration time.Duration
	// Rate is the orders per second placed meanwhile.
	Rate float64
	// KillMin and KillMax bound the random wait before each kill.
	KillMin, KillMax time.Duration
	// MinKills, when set, keeps killing past Duration until that many
	// kills are done.
	MinKills int
	// Seed makes the schedule of kills repeatable.
	Seed uint64
	// Settle bounds the wait for every effect once the kills stop.
	Settle time.Duration
	// LogDir receives each process's log.
	LogDir string
	// Progress, when set, receives a line every 10 seconds and one per
	// phase.
	Progress io.Writer
}

// randomDefaults are the settings of a random-kill run that its flags
// leave out.
var randomDefaults = randomOptions{Rate: 30, Replicas: 2, KillMin: 500 * time.Millisecond, KillMax: 4 * time.Second, Settle: 2 * time.Minute}

// randomReport is the outcome of a random-kill run.
type randomReport struct {
	Options randomOptions
	// Accepted counts the orders answered 201; Requests, every POST sent;
	// GaveUp, the orders whose every attempt failed until the end;
	// Cancelled, the accepted orders cancelled then.
	Accepted, Requests, GaveUp, Cancelled int
	// Kills counts the SIGKILLs, per process.
	Kills map[string]int
	// Checks are the verdict, one row each.
	Checks []shopkit.Check
}

// failed returns the rows that did not pass.
func (r randomReport) failed() int {
	n := 0
	for _, c := range r.Checks {
		if !c.OK {
			n++
		}
	}
	return n
}

// randomProcess is a process of a random-kill run.
type randomProcess struct {
	name  string
	start func(ctx context.Context) (*shopkit.Proc, error)
	p     *shopkit.Proc
}

// replicaName names the i-th (from 1) of n replicas of a service.
func replicaName(service string, i, n int) string {
	if n == 1 {
		return service
	}
	return fmt.Sprintf("%s-%d", service, i)
}

// runRandom starts the shop as separate processes (the order API with the
// carrier, stock, shipping, billing, the relays, o.Replicas of each but the
// carrier; and the broker with o.BrokerDir) in a namespace of its own,
// places orders at o.Rate, each retried with its Idempotency-Key until it
// is accepted, and for o.Duration kills one process at random with SIGKILL
// every o.KillMin to o.KillMax and starts it again at once. Then it waits
// for every effect and checks, from the databases and not from the
// services' counters: every accepted order exists once with one reservation
// per line, one preparation, one pickup at the carrier, one invoice and one
// e-mail, and nothing else; no message was parked by a consumer nor
// quarantined by a relay; every invoice is marked e-mailed.
func runRandom(ctx context.Context, o randomOptions) (randomReport, error) {
	rep := randomReport{Options: o, Kills: map[string]int{}}
	ns := "random_" + shopkit.RandomSuffix()
	cl := &shopkit.Cluster{Binary: o.Binary, DB: o.DB, Broker: o.Broker, Namespace: ns, LogDir: o.LogDir, Relay: o.Relay, Outbox: o.Outbox}
	in, err := shopkit.OpenInspector(ctx, o.DB, ns)
	if err != nil {
		return rep, err
	}
	in.OutboxRowsDeleted = o.Relay == shopkit.RelayCDC
	defer in.Close()
	defer func() { cl.StopAll(); in.DropNamespace() }()

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
	carrierURL := "http://" + fronts[0] + "/carrier"
	service := func(spec shopkit.ProcSpec) *randomProcess {
		return &randomProcess{name: spec.Name, start: func(ctx context.Context) (*shopkit.Proc, error) {
			// As a supervisor would, start a process again that died
			// during its start-up: on SQLite, a migration check may meet
			// "database is locked" while the other processes write.
			var err error
			for range 5 {
				var p *shopkit.Proc
				if p, err = cl.Start(ctx, spec); err == nil || !errors.Is(err, shopkit.ErrExitedAtStart) {
					return p, err
				}
			}
			return nil, err
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
	progress("%s of kills every %v-%v at %.0f orders/s; processes: %s", o.Duration, o.KillMin, o.KillMax, o.Rate, procNames(procs))

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	ld := &randomLoad{addrs: fronts, client: &http.Client{Timeout: 10 * time.Second}}
	defer ld.client.CloseIdleConnections()
	// New orders are placed until the kills stop; each is retried until
	// accepted, or until the settle time has passed after the kills.
	killsDone := make(chan struct{})
	var giveUp atomic.Int64
	giveUp.Store(time.Now().Add(o.Duration + o.Settle).UnixNano())
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		ld.run(runCtx, o.Rate, killsDone, &giveUp)
	}()

	start := time.Now()
	rng := rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15))
	nextReport := start.Add(10 * time.Second)
	var killErr error
	for killErr == nil {
		wait := o.KillMin + time.Duration(rng.Int64N(int64(o.KillMax-o.KillMin)+1))
		if time.Since(start)+wait >= o.Duration && sumKills(rep.Kills) >= o.MinKills {
			break
		}
		if !ctxsleep.Sleep(ctx, wait) {
			killErr = ctx.Err()
			break
		}
		rp := procs[rng.IntN(len(procs))]
		rp.p.Kill()
		rep.Kills[rp.name]++
		if rp.p, err = rp.start(ctx); err != nil {
			killErr = fmt.Errorf("restart %s after its kill: %w", rp.name, err)
		}
		if time.Now().After(nextReport) {
			nextReport = nextReport.Add(10 * time.Second)
			progress("%v: %d orders accepted, %d kills", time.Since(start).Round(time.Second), ld.accepted.Load(), sumKills(rep.Kills))
		}
	}
	if killErr == nil {
		ctxsleep.Sleep(ctx, o.Duration-time.Since(start))
	}
	giveUp.Store(time.Now().Add(o.Settle).UnixNano())
	close(killsDone)
	progress("kills stopped after %v (%d); waiting for the orders in flight", time.Since(start).Round(time.Second), sumKills(rep.Kills))
	<-loadDone
	rep.Accepted, rep.Requests, rep.GaveUp = int(ld.accepted.Load()), int(ld.requests.Load()), int(ld.gaveUp.Load())
	rep.Cancelled = int(ld.cancelled.Load())
	if n := ld.cancelsGivenUp.Load(); n > 0 {
		rep.Checks = append(rep.Checks, shopkit.Check{What: "every cancellation accepted", Observed: fmt.Sprintf("%d cancellations still refused at the end", n)})
	}
	if killErr != nil {
		return rep, killErr
	}
	progress("%d orders accepted (%d requests, %d gave up); waiting for every effect", rep.Accepted, rep.Requests, rep.GaveUp)

	want := rep.Accepted
	if rep.GaveUp > 0 {
		want = -1 // an order given up may or may not exist
	}
	obs, ok := in.Settle(ctx, o.Settle, want)
	if ok {
		// A sentinel: one more order, whose events follow every earlier one
		// through the relays and the queues. Once all its effects are there,
		// a copy still on its way (a redelivery, a republish) would have
		// come before them.
		id, err := shopkit.PlaceOK(ctx, fronts[0], "sentinel", 1)
		if err != nil {
			return rep, fmt.Errorf("the sentinel order: %w", err)
		}
		ld.mu.Lock()
		ld.orders[id] = true
		ld.mu.Unlock()
		if want >= 0 {
			want++
		}
		obs, ok = in.Settle(ctx, o.Settle, want)
	}
	rep.Checks = append(rep.Checks, shopkit.Check{What: "every order: 1 reservation per line, 1 preparation, 1 pickup, 1 invoice, 1 e-mail; nothing for an order never committed", Observed: obs, OK: ok})
	s, err := in.State(ctx)
	if err != nil {
		return rep, err
	}
	rep.Checks = append(rep.Checks, ld.checkOrders(s, rep.GaveUp))
	left, err := in.Leftovers(ctx)
	if err != nil {
		return rep, err
	}
	rep.Checks = append(rep.Checks, left...)
	inOrder, err := in.AppliedInOrder(ctx)
	if err != nil {
		return rep, err
	}
	rep.Checks = append(rep.Checks, inOrder)
	return rep, nil
}

func procNames(procs []*randomProcess) string {
	names := make([]string, len(procs))
	for i, rp := range procs {
		names[i] = rp.name
	}
	return strings.Join(names, ", ")
}

func sumKills(k map[string]int) int {
	n := 0
	for _, v := range k {
		n += v
	}
	return n
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
	// still refused at the end.
	cancelled, cancelsGivenUp atomic.Int64
	mu                        sync.Mutex
	orders                    map[string]bool // the ids of the accepted orders
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
		if time.Now().UnixNano() > giveUp.Load() || !ctxsleep.Sleep(ctx, backoff) {
			l.cancelsGivenUp.Add(1)
			return
		}
	}
}

// checkOrders compares the orders in the database with those accepted:
// each accepted order exists, and, when no order was given up, no other.
func (l *randomLoad) checkOrders(s shopkit.State, gaveUp int) shopkit.Check {
	l.mu.Lock()
	defer l.mu.Unlock()
	var missing, extra []string
	for id := range l.orders {
		if s.Lines[id] == 0 {
			missing = append(missing, id)
		}
	}
	for id := range s.Lines {
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
		c.Observed = fmt.Sprintf("%d orders accepted, %d in the database", len(l.orders), len(s.Lines))
		if gaveUp > 0 {
			c.Observed += fmt.Sprintf(" (%d requests given up, %d of them committed)", gaveUp, len(extra))
		}
	}
	return c
}

// printRandom writes the report of a random-kill run.
func printRandom(w io.Writer, r randomReport) {
	o := r.Options
	stack := schemeOf(o.DB) + " + " + schemeOf(o.Broker)
	relayMode := cmp.Or(o.Relay, shopkit.RelayPoll)
	if o.Outbox != "" {
		relayMode += ", outbox " + o.Outbox
	}
	names := make([]string, 0, len(r.Kills))
	for n := range r.Kills {
		names = append(names, n)
	}
	slices.Sort(names)
	var kills []string
	for _, n := range names {
		kills = append(kills, fmt.Sprintf("%s %d", n, r.Kills[n]))
	}
	parts := "unpartitioned"
	if o.Partitions > 0 {
		parts = fmt.Sprintf("%d partitions", o.Partitions)
	}
	fmt.Fprintf(w, "random kills: %v on %s, relay %s, %d replica(s) of each service, %s, seed %d\n", o.Duration, stack, relayMode, max(o.Replicas, 1), parts, o.Seed)
	fmt.Fprintf(w, "orders: %d accepted, %d requests (%d retried), %d given up, %d cancelled\n", r.Accepted, r.Requests, r.Requests-r.Accepted-r.GaveUp, r.GaveUp, r.Cancelled)
	fmt.Fprintf(w, "kills: %d (%s)\n\n", sumKills(r.Kills), strings.Join(kills, ", "))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tOBSERVED\tRESULT")
	for _, c := range r.Checks {
		status := "pass"
		if !c.OK {
			status = "FAIL"
		}
		obs := strings.ReplaceAll(c.Observed, "\n", " ")
		if len(obs) > 300 {
			obs = obs[:300] + "..."
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.What, obs, status)
	}
	_ = tw.Flush()
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
			case "rate", "kill-min", "kill-max", "seed", "settle", "relay", "outbox", "replicas", "partitions":
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
	case o.Relay == shopkit.RelayCDC && dbURL != "" && !isPostgresURL(dbURL), o.Relay == shopkit.RelayCDC && dbURL == "":
		return errors.New("--relay cdc reads PostgreSQL's write-ahead log: give --db postgres://... (and --broker)")
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
