package main

import (
	"context"
	"debug/buildinfo"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/envflag"
	"github.com/idem-go/idem/internal/fault"
	"github.com/idem-go/idem/internal/registry"
	"github.com/idem-go/idem/internal/testkafka"
	"github.com/idem-go/idem/internal/tools/shopkit"
	"github.com/idem-go/idem/relay"
)

// chaosCase is one line of the crash table.
type chaosCase struct {
	// Name is the fault point or situation.
	Name string
	// Expected is what must hold after recovery.
	Expected string
	// Relay, when set, is the --relay of every process of the case; the
	// CDC relay's cases run on PostgreSQL and MariaDB (its binlog), those
	// with WAL messages on PostgreSQL only.
	Relay string
	// Outbox, when set, is the --outbox of every process of the case.
	Outbox string
	run    func(ctx context.Context, r *chaosRun) (string, error)
}

// applies reports whether the case runs on the database at dbURL.
func (c chaosCase) applies(dbURL string) bool {
	switch {
	case c.Relay != shopkit.RelayCDC || isPostgresURL(dbURL):
		return true
	case c.Outbox == shopkit.OutboxLog:
		return false // WAL messages: PostgreSQL's
	}
	return isMariaDBURL(dbURL)
}

// isMariaDBURL reports whether rawURL is a MySQL/MariaDB URL.
func isMariaDBURL(rawURL string) bool {
	scheme, _, _ := strings.Cut(strings.ToLower(rawURL), "://")
	return scheme == "mysql" || scheme == "mariadb"
}

// isPostgresURL reports whether rawURL is a PostgreSQL URL.
func isPostgresURL(rawURL string) bool {
	scheme, _, _ := strings.Cut(rawURL, "://")
	scheme = strings.ToLower(scheme)
	return scheme == "postgres" || scheme == "postgresql"
}

// applicableCases counts the cases of the crash table that run on the
// database at dbURL.
func applicableCases(dbURL string) int {
	n := 0
	for _, c := range chaosCases {
		if c.applies(dbURL) {
			n++
		}
	}
	return n
}

// chaosRun is the environment of one case: its own namespace (schemas,
// exchange and queues) on shared servers.
type chaosRun struct {
	*shopkit.Cluster
	in *shopkit.Inspector
	// appAddr is the HTTP address of the process with the carrier, picked
	// before it starts when another process needs it first.
	appAddr string
}

// appServices are the services of the "app" process when the relay runs
// apart.
const appServices = "carrier,order,stock,shipping,billing"

func (r *chaosRun) app(ctx context.Context, services, fault string) (*shopkit.Proc, error) {
	p, err := r.Start(ctx, shopkit.ProcSpec{Name: strings.ReplaceAll(services, ",", "+"), Services: services, Fault: fault})
	if err == nil {
		r.in.API = p.HTTP // the settle's sentinel order
	}
	return p, err
}

func (r *chaosRun) orders(ctx context.Context, addr string, n int) error {
	for i := range n {
		if _, err := shopkit.PlaceOK(ctx, addr, fmt.Sprintf("c-%d", i), 1+i%3); err != nil {
			return err
		}
	}
	return nil
}

// crashAndRecover starts the app (all services but those in split) and one
// process of split's services armed with fault, places n orders, waits for
// the armed process to die at the fault point, restarts it unarmed and checks
// the databases.
func crashAndRecover(split, fault string, n int) func(ctx context.Context, r *chaosRun) (string, error) {
	return func(ctx context.Context, r *chaosRun) (string, error) {
		rest := []string{}
		for _, s := range strings.Split(appServices+",relay", ",") {
			if !strings.Contains(","+split+",", ","+s+",") {
				rest = append(rest, s)
			}
		}
		// Consumers declare their queues before any relay publishes.
		armedFirst := !strings.Contains(split, "relay")
		var app, armed *shopkit.Proc
		var err error
		if armedFirst {
			if armed, err = r.Start(ctx, shopkit.ProcSpec{Name: split, Services: split, Fault: fault, CarrierURL: "http://" + mustAddr(r) + "/carrier"}); err != nil {
				return "", err
			}
		}
		if app, err = r.Start(ctx, shopkit.ProcSpec{Name: "app", Services: strings.Join(rest, ","), HTTP: r.appAddr}); err != nil {
			return "", err
		}
		r.in.API = app.HTTP
		if !armedFirst {
			// A relay may reach its fault point before it says it is
			// ready, publishing what the app wrote at its start: that is
			// the crash the case is about.
			armed, err = r.Start(ctx, shopkit.ProcSpec{Name: split, Services: split, Fault: fault})
			if err != nil && !(errors.Is(err, shopkit.ErrExitedAtStart) && armed != nil && strings.Contains(armed.Tail(), "fault point "+fault)) {
				return "", err
			}
		}
		if err := r.orders(ctx, app.HTTP, n); err != nil {
			return "", err
		}
		if err := armed.WaitKilled(shopkit.SettleTimeout); err != nil {
			return "", err
		}
		spec := shopkit.ProcSpec{Name: split, Services: split}
		if armedFirst {
			spec.CarrierURL = "http://" + app.HTTP + "/carrier"
		}
		if _, err := r.Start(ctx, spec); err != nil {
			return "", err
		}
		obs, ok := r.in.Settle(ctx, shopkit.SettleTimeout, n)
		if !ok {
			return obs, errors.New(obs)
		}
		return "killed, restarted; " + obs, nil
	}
}

func mustAddr(r *chaosRun) string {
	if r.appAddr == "" {
		r.appAddr, _ = shopkit.FreeAddr()
	}
	return r.appAddr
}

var chaosCases = []chaosCase{
	{
		Name:     fault.OrderBeforeCommit,
		Expected: "no order, no event; a retry with the same Idempotency-Key makes one order",
		run: func(ctx context.Context, r *chaosRun) (string, error) {
			app, err := r.app(ctx, appServices+",relay", fault.OrderBeforeCommit)
			if err != nil {
				return "", err
			}
			if _, err := shopkit.PlaceOrder(ctx, app.HTTP, "chaos-key-1", "c-1", 2); err == nil {
				return "", errors.New("the order request succeeded although the process should have died before its commit")
			}
			if err := app.WaitKilled(10 * time.Second); err != nil {
				return "", err
			}
			if _, err := r.Start(ctx, shopkit.ProcSpec{Name: "app", Services: appServices + ",relay", HTTP: app.HTTP}); err != nil {
				return "", err
			}
			// The key's claim was in the crashed request's transaction: it
			// rolled back with the order, and the retry runs at once. (A
			// claim left "processing" by an older binary answers 409 until
			// the lock timeout, 1s here, then the retry takes it over.)
			conflicts := 0
			deadline := time.Now().Add(15 * time.Second)
			for {
				res, err := shopkit.PlaceOrder(ctx, app.HTTP, "chaos-key-1", "c-1", 2)
				if err != nil {
					return "", err
				}
				if res.Status == http.StatusCreated {
					break
				}
				if res.Status != http.StatusConflict || time.Now().After(deadline) {
					return "", fmt.Errorf("retry with the same key: %d %s", res.Status, res.Body)
				}
				conflicts++
				time.Sleep(200 * time.Millisecond)
			}
			if err := r.orders(ctx, app.HTTP, 2); err != nil {
				return "", err
			}
			obs, ok := r.in.Settle(ctx, shopkit.SettleTimeout, 3)
			if !ok {
				return obs, errors.New(obs)
			}
			return fmt.Sprintf("retry got %d x 409 then 201; %s", conflicts, obs), nil
		},
	},
	{
		Name:     fault.RelayAfterClaim,
		Expected: "after the commit, before publication: the event is published after the restart",
		run:      crashAndRecover("relay", fault.RelayAfterClaim, 3),
	},
	{
		Name:     fault.RelayAfterPublishBeforeMark,
		Expected: "relay republishes (duplicate source 1): consumers skip the copies",
		run:      crashAndRecover("relay", fault.RelayAfterPublishBeforeMark, 3),
	},
	{
		Name:     fault.CDCAfterReceive,
		Expected: "CDC relay: received from the log, nothing published: the restarted relay reads it again and publishes it",
		Relay:    shopkit.RelayCDC,
		run:      crashAndRecover("relay", fault.CDCAfterReceive, 3),
	},
	{
		Name:     fault.CDCAfterPublishBeforeConfirm,
		Expected: "CDC relay: published, position not confirmed (slot) or stored (binlog): republished (duplicate source 1), consumers skip the copies",
		Relay:    shopkit.RelayCDC,
		run:      crashAndRecover("relay", fault.CDCAfterPublishBeforeConfirm, 3),
	},
	{
		Name:     fault.CDCAfterConfirm,
		Expected: "CDC relay: position confirmed: the restarted relay resumes after it, nothing lost",
		Relay:    shopkit.RelayCDC,
		run:      crashAndRecover("relay", fault.CDCAfterConfirm, 3),
	},
	{
		Name:     fault.CDCAfterPublishBeforeConfirm + " (WAL messages)",
		Expected: "events written as WAL messages (--outbox log), no outbox row: republished, consumers skip the copies",
		Relay:    shopkit.RelayCDC,
		Outbox:   shopkit.OutboxLog,
		run:      crashAndRecover("relay", fault.CDCAfterPublishBeforeConfirm, 3),
	},
	{
		Name:     fault.ShippingBeforeCommit,
		Expected: "marker and preparation rolled back; the event is processed again",
		run:      crashAndRecover("shipping", fault.ShippingBeforeCommit, 3),
	},
	{
		Name:     fault.InboxAfterCommitBeforeAck,
		Expected: "broker redelivers (duplicate source 2): no second preparation",
		run:      crashAndRecover("shipping", fault.InboxAfterCommitBeforeAck, 3),
	},
	{
		Name:     "two simultaneous deliveries",
		Expected: "two shipping processes get the same events at once: one preparation",
		run:      simultaneous,
	},
	{
		Name:     "carrier answer lost",
		Expected: "the pickup is found by reference or the retry uses the same key: one pickup",
		run:      lostAnswer,
	},
	{
		Name:     "manual replay of a period",
		Expected: "replayed events (duplicate source 3) change nothing",
		run:      replayPeriod,
	},
}

// simultaneous runs two shipping processes and has every order event
// delivered twice at the same moment: the relay is followed by a replay of
// the same events, published in one call with each message twice.
func simultaneous(ctx context.Context, r *chaosRun) (string, error) {
	addr := mustAddr(r)
	for i := range 2 {
		if _, err := r.Start(ctx, shopkit.ProcSpec{Name: fmt.Sprintf("shipping%d", i+1), Services: "shipping", CarrierURL: "http://" + addr + "/carrier"}); err != nil {
			return "", err
		}
	}
	app, err := r.Start(ctx, shopkit.ProcSpec{Name: "app", Services: "carrier,order,stock,billing,relay", HTTP: addr})
	if err != nil {
		return "", err
	}
	r.in.API = app.HTTP
	if err := r.orders(ctx, app.HTTP, 4); err != nil {
		return "", err
	}
	if obs, ok := r.in.Settle(ctx, shopkit.SettleTimeout, 4); !ok {
		return obs, errors.New(obs)
	}
	n, err := r.replay(ctx, 2)
	if err != nil {
		return "", err
	}
	obs, ok := r.in.Settle(ctx, shopkit.SettleTimeout, 4)
	if !ok {
		return obs, errors.New(obs)
	}
	return fmt.Sprintf("%d duplicate messages delivered to 2 processes; %s", n, obs), nil
}

func lostAnswer(ctx context.Context, r *chaosRun) (string, error) {
	app, err := r.app(ctx, appServices+",relay", "")
	if err != nil {
		return "", err
	}
	if err := shopkit.PostJSON(ctx, "http://"+app.HTTP+"/carrier/control", map[string]int{"drop_responses": 3}); err != nil {
		return "", err
	}
	if err := r.orders(ctx, app.HTTP, 3); err != nil {
		return "", err
	}
	obs, ok := r.in.Settle(ctx, shopkit.SettleTimeout, 3)
	if !ok {
		return obs, errors.New(obs)
	}
	var st struct {
		Dropped int `json:"dropped"`
	}
	if err := shopkit.GetJSON(ctx, "http://"+app.HTTP+"/carrier/stats", &st); err != nil {
		return "", err
	}
	if st.Dropped != 3 {
		return "", fmt.Errorf("the carrier dropped %d answers, want 3", st.Dropped)
	}
	return fmt.Sprintf("%d answers dropped; %s", st.Dropped, obs), nil
}

func replayPeriod(ctx context.Context, r *chaosRun) (string, error) {
	app, err := r.app(ctx, appServices+",relay", "")
	if err != nil {
		return "", err
	}
	if err := r.orders(ctx, app.HTTP, 3); err != nil {
		return "", err
	}
	if obs, ok := r.in.Settle(ctx, shopkit.SettleTimeout, 3); !ok {
		return obs, errors.New(obs)
	}
	n, err := r.replay(ctx, 1)
	if err != nil {
		return "", err
	}
	obs, ok := r.in.Settle(ctx, shopkit.SettleTimeout, 3)
	if !ok {
		return obs, errors.New(obs)
	}
	return fmt.Sprintf("%d events of the last hour replayed; %s", n, obs), nil
}

// duplicating publishes every message copies times in the same call.
type duplicating struct {
	registry.Publisher
	copies int
}

func (d duplicating) Publish(ctx context.Context, msgs []idem.Message) error {
	var out []idem.Message
	for _, m := range msgs {
		for range d.copies {
			out = append(out, m)
		}
	}
	return d.Publisher.Publish(ctx, out)
}

// replay publishes the order outbox's events of the last hour again, each
// copies times, as "idem replay" would.
func (r *chaosRun) replay(ctx context.Context, copies int) (int64, error) {
	pub, err := registry.OpenPrefixed(ctx, r.Broker, r.Namespace)
	if err != nil {
		return 0, err
	}
	defer pub.Close()
	n, err := relay.Replay(ctx, r.in.DBs["order"].Driver, duplicating{pub, copies},
		relay.ReplayFilter{Since: time.Now().Add(-time.Hour)}, relay.ReplayOptions{})
	return n * int64(copies), err
}

// chaosResult is one row of the printed table.
type chaosResult struct {
	Case     chaosCase
	Observed string
	Err      error
	Took     time.Duration
}

// chaosOptions configure runChaos.
type chaosOptions struct {
	Binary, DB, Broker string
	// Only, when set, keeps the cases whose name contains one of its
	// comma-separated words.
	Only string
	// LogDir receives each process's log.
	LogDir string
	// Progress, when set, receives a line per finished case.
	Progress io.Writer
}

// runChaos runs the crash table, each case in its own namespace, and returns
// a row per case.
func runChaos(ctx context.Context, o chaosOptions) []chaosResult {
	var out []chaosResult
	for _, c := range chaosCases {
		if o.Only != "" && !matchesAny(c.Name, o.Only) {
			continue
		}
		if !c.applies(o.DB) {
			continue
		}
		start := time.Now()
		ns := "chaos_" + shopkit.RandomSuffix()
		res := chaosResult{Case: c}
		func() {
			cl := &shopkit.Cluster{Binary: o.Binary, DB: o.DB, Broker: o.Broker, Namespace: ns, LogDir: o.LogDir, Relay: c.Relay, Outbox: c.Outbox}
			defer cl.StopAll()
			in, err := shopkit.OpenInspector(ctx, o.DB, ns)
			if err != nil {
				res.Err = err
				return
			}
			defer in.Close()
			// The processes stop before their namespace goes: a CDC
			// relay's slot can be dropped only once nobody reads it.
			defer func() { cl.StopAll(); in.DropNamespace() }()
			res.Observed, res.Err = c.run(ctx, &chaosRun{Cluster: cl, in: in})
		}()
		res.Took = time.Since(start)
		if o.Progress != nil {
			status := "PASS"
			if res.Err != nil {
				status = "FAIL: " + res.Err.Error()
			}
			fmt.Fprintf(o.Progress, "chaos: %-34s %s (%v)\n", c.Name, status, res.Took.Round(time.Millisecond))
		}
		out = append(out, res)
	}
	return out
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func matchesAny(name, words string) bool {
	for _, w := range strings.Split(words, ",") {
		if w = strings.TrimSpace(w); w != "" && strings.Contains(name, w) {
			return true
		}
	}
	return false
}

// printTable writes the crash table.
func printTable(w io.Writer, results []chaosResult) (failed int) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POINT\tEXPECTED\tOBSERVED\tRESULT")
	for _, r := range results {
		status, obs := "pass", r.Observed
		if r.Err != nil {
			status, failed = "FAIL", failed+1
			obs = r.Err.Error()
		}
		obs = strings.ReplaceAll(obs, "\n", " ")
		if most := 200 + 800*boolInt(r.Err != nil); len(obs) > most {
			obs = obs[:most] + "..." // a failure says more
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Case.Name, r.Case.Expected, obs, status)
	}
	_ = tw.Flush()
	return failed
}

var chaosEnv = map[string]string{"db": "SHOP_DB_URL", "broker": "SHOP_BROKER_URL"}

func chaosMain(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("shopctl chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o chaosOptions
	fs.StringVar(&o.Binary, "shop", "", "the shop binary to run, built with -tags "+fault.Tag+"; default: one built from this module in a temporary directory")
	fs.StringVar(&o.DB, "db", "", "database URL the shop processes use (each case gets its own schemas); default: SQLite files in a temporary directory")
	fs.StringVar(&o.Broker, "broker", "", "broker URL (each case gets its own exchange and queues); default: a NATS JetStream server run by shopctl chaos;\n\"kfake\": a Kafka cluster run by shopctl chaos itself (franz-go's kfake, in memory, on a local port)")
	fs.StringVar(&o.Only, "only", "", "run only the cases whose name contains one of these comma-separated words")
	keep := fs.Bool("keep-logs", false, "keep the processes' logs (their directory is printed) and, with --random, the run's databases\n(the embedded defaults' directory, the schemas of the run's namespace) when a check fails")
	ro := randomDefaults
	fs.DurationVar(&ro.Duration, "random", 0, "instead of the crash table, kill the shop's processes at random for this long, under load (see below)")
	fs.Float64Var(&ro.Rate, "rate", ro.Rate, "with --random: orders per second placed while processes are killed")
	fs.DurationVar(&ro.KillMin, "kill-min", ro.KillMin, "with --random: the shortest wait before a kill")
	fs.DurationVar(&ro.KillMax, "kill-max", ro.KillMax, "with --random: the longest wait before a kill")
	fs.DurationVar(&ro.FreezeMin, "freeze-min", ro.FreezeMin, "with --random: the shortest freeze (SIGSTOP, then SIGCONT) of a process")
	fs.DurationVar(&ro.FreezeMax, "freeze-max", ro.FreezeMax, "with --random: the longest freeze; 0 makes none")
	fs.BoolVar(&ro.Strict, "strict", false, "with --random: fail on a check that could not run, as on a failed one")
	fs.BoolVar(&ro.NoReplay, "no-replay", false, "with --random: leave out the replay, halfway through, of the events every consumer applied")
	dbStart := fs.String("db-start", "", "with --random: fault the database server at --db too (SIGKILL of all its processes, freezes, commits\nheld before they are visible), and start it again after a kill with this command (run by sh -c),\nwhich must wait until it serves, such as \"$IDEM_TEST_POSTGRES_START\"; only for a server of your own on\nthis machine, which nobody else uses: its faults are theirs too")
	fs.Uint64Var(&ro.Seed, "seed", 0, "with --random: the seed of the kill schedule (0: a random one, printed)")
	fs.DurationVar(&ro.Settle, "settle", ro.Settle, "with --random: how long to wait for every effect once the kills stop (and up to as long again while consumers still apply events)")
	fs.StringVar(&ro.Relay, "relay", "", "with --random: the relays' --relay (poll, or cdc on PostgreSQL and MariaDB)")
	fs.StringVar(&ro.Outbox, "outbox", "", "with --random: the services' --outbox (rows, or log with --relay cdc)")
	fs.IntVar(&ro.Replicas, "replicas", ro.Replicas, "with --random: processes of each service (consumers, relays, order API); replicas of a consumer\nshare its queue: the extra ones stand by, or share its partitions when the broker URL sets them")
	fs.IntVar(&ro.Partitions, "partitions", 0, "with --random: partition each consumer's queue (RabbitMQ) or the stream (NATS) in this many\npartitions, which the replicas of a consumer share (adds partitions=N to the broker URL)")
	fs.Usage = envflag.Usage(fs, chaosEnv, `Usage: shopctl chaos [flags]

Runs the crash table: for each case, starts shop processes on fresh schemas,
kills one at a named fault point (IDEM_FAULT), restarts it, and checks every
database: each committed order has exactly one reservation per line, one
preparation, one pickup at the carrier, one invoice and one e-mail; an order
that was never committed has none. Prints a table and fails if a case fails.
On PostgreSQL the table also kills the CDC relay (shop --relay cdc) at its
three fault points; each case's replication slots are dropped with its
schemas.

With --random DURATION, it runs the shop instead as separate processes,
--replicas of each (the order API, the first with the carrier, stock,
shipping, billing, the relays; on the embedded defaults, the broker too, as
shop broker), places --rate orders per second, each retried with its
Idempotency-Key until it is accepted, as a client whose request failed
would, every fourth cancelled once accepted, and for DURATION makes a fault
every --kill-min to --kill-max: a process killed with SIGKILL and started
again at once, or frozen with SIGSTOP for --freeze-min to --freeze-max
(the next faults go on meanwhile; now and then two at once). The targets
come in rounds, each a random order of every process, and a process's
first fault is a kill: a run that lasts a round kills every process (the
relay holding the log's slot, the broker) at least once. With --db-start,
the database server is a target too: killed with SIGKILL (all its
processes) and started again by that command, frozen, or its commits held
after their log record is flushed (a synchronous standby, or a
semi-synchronous replica, that does not answer): only on a server of your
own, which nobody else uses. Halfway through, the events every consumer
applied are published again, as idem replay would. The run prints every
fault it made, and when.

Then it waits for every effect, a sentinel order placed and cancelled
last, and checks, from the databases and the processes' logs, never from
the services' counters: every accepted order committed once with all its
effects, and a cancelled one compensated by every service; nothing for an
order never accepted; from each consumer's application ledger
(applied_event, written in the consumer's transaction by a shop built with
idemfault), every event of every outbox applied exactly once by each
consumer subscribed to it, in the order of its aggregate's versions;
nothing parked by a consumer, nothing quarantined or left behind by a
relay; every invoice marked e-mailed; no consumer that met an event before
its row was visible in the producer's database (G13); no process that died
on its own; no race report (a shop built with -race). It prints a verdict
table and fails if a check fails; a check that could not run says "not
run", and --strict fails on it too.

Fault points exist only in a shop built with the build tag idemfault. With
no --shop, shopctl chaos builds one (go build -tags idemfault ./cmd/shop,
which needs the Go toolchain and this module); --shop runs one built so (go
build -tags idemfault -o shop-chaos ./cmd/shop). A shop built without the
tag is refused.

Flags:
`, `
With no --db and --broker, the processes share SQLite files in a temporary
directory and a NATS JetStream server that shopctl chaos runs itself (with
--random, as a process of its own that it kills and restarts too). On Kafka,
give the consumers a short session timeout (?session_timeout=6s): a killed
consumer keeps its partitions until its session expires, 45s by default,
which is as long as a case waits for its effects after the restart.

Examples:
  go run ./internal/tools/shopctl chaos
  go run ./internal/tools/shopctl chaos --db postgres://postgres@localhost/shop --broker amqp://guest:guest@localhost:5672/
  shopctl chaos --shop ./shop-chaos --db mysql://root@localhost:3306/shop --broker 'kafka://localhost:9092?session_timeout=6s'
  shopctl chaos --random 2m --rate 30 --relay cdc --db postgres://postgres@localhost/shop --broker amqp://guest:guest@localhost:5672/
  shopctl chaos --random 10m --strict --relay cdc --db mysql://root@127.0.0.1:13306/shop --db-start "$IDEM_TEST_MARIADB_START" --broker kfake

A mutant shop (go build -tags idemfault,idemmutant ./cmd/shop) carries a
known bug chosen by IDEM_MUTANT (internal/mutant): the verdict must fail
on it, e.g. IDEM_MUTANT=relay.drop-one shopctl chaos --random 1m --shop ./shop-mutant ...
`)
	if err := envflag.Parse(fs, args, chaosEnv); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError(fmt.Sprintf("shopctl chaos takes no arguments (got %q): see shopctl help chaos", fs.Args()))
	}
	if (o.DB == "") != (o.Broker == "") {
		return errors.New("shopctl chaos needs both --db and --broker, or neither (the embedded defaults)")
	}
	if o.Broker == "kfake" {
		url, stop, err := testkafka.Listen()
		if err != nil {
			return fmt.Errorf("--broker kfake: %w", err)
		}
		defer stop()
		// A killed consumer keeps its partitions until its session ends.
		o.Broker = url + "?session_timeout=6s"
		fmt.Fprintf(stdout, "broker: kfake (Kafka in memory, in this process) at %s\n", o.Broker)
	}
	ro.Broker = o.Broker
	if err := ro.check(o.DB, fs); err != nil {
		return err
	}
	if *dbStart != "" {
		if o.DB == "" || strings.HasPrefix(o.DB, "sqlite:") {
			return errors.New("--db-start faults a database server: give --db postgres://... or mysql://... of a server of your own")
		}
		ro.Servers = append(ro.Servers, serverDB(&shopkit.DBServer{URL: o.DB, Start: []string{"sh", "-c", *dbStart}}))
	}
	if o.Binary == "" {
		dir, err := os.MkdirTemp("", "shopctl-chaos-bin-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		fmt.Fprintf(stderr, "chaos: building the shop with -tags %s\n", fault.Tag)
		if o.Binary, err = buildShop(dir, stderr); err != nil {
			return err
		}
	} else if err := checkFaultBuild(o.Binary); err != nil {
		return err
	}
	var err error
	if o.LogDir, err = os.MkdirTemp("", "shop-chaos-"); err != nil {
		return err
	}
	if !*keep {
		defer os.RemoveAll(o.LogDir)
	} else {
		fmt.Fprintln(stdout, "logs in", o.LogDir)
	}
	if o.DB == "" {
		dir, err := os.MkdirTemp("", "shop-chaos-data-")
		if err != nil {
			return err
		}
		defer func() {
			if !ro.KeepData {
				os.RemoveAll(dir)
			}
		}()
		if ro.Duration > 0 {
			// Random kills run the broker as a process, to kill it too.
			o.DB, ro.BrokerDir = "sqlite:"+filepath.Join(dir, "db"), dir
			fmt.Fprintf(stdout, "embedded defaults: database %s, broker: shop broker with its data in %s\n", o.DB, dir)
		} else {
			var stop func()
			if o.DB, o.Broker, stop, err = shopkit.StartEmbedded(context.Background(), dir); err != nil {
				return err
			}
			defer stop()
			fmt.Fprintf(stdout, "embedded defaults: database %s, broker %s\n", o.DB, o.Broker)
		}
	}
	o.Progress = stderr
	if ro.Duration > 0 {
		ro.Binary, ro.DB, ro.Broker, ro.LogDir, ro.Progress = o.Binary, o.DB, o.Broker, o.LogDir, stderr
		ro.KeepFailed = *keep
		rep, err := runRandom(context.Background(), ro)
		ro.KeepData = rep.Kept != ""
		if ro.KeepData {
			fmt.Fprintf(stdout, "databases kept: namespace %s\n", rep.Kept)
		}
		printRandom(stdout, rep)
		if err != nil {
			return err
		}
		if failed := rep.failed(); failed > 0 {
			return fmt.Errorf("%d of %d checks failed (seed %d)", failed, len(rep.Checks), ro.Seed)
		}
		return nil
	}
	results := runChaos(context.Background(), o)
	if failed := printTable(stdout, results); failed > 0 {
		return fmt.Errorf("%d of %d cases failed", failed, len(results))
	}
	return nil
}

// shopPackage is the import path of the shop.
const shopPackage = "github.com/idem-go/idem/cmd/shop"

// buildShop builds the shop with its fault points into dir, with the go
// command of the PATH, and returns the binary's path.
func buildShop(dir string, stderr io.Writer) (string, error) {
	bin := filepath.Join(dir, "shop")
	cmd := exec.Command("go", "build", "-tags", fault.Tag, "-o", bin, shopPackage)
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build the shop (go build -tags %s %s): %w; run shopctl chaos in a clone of the repository, or give --shop", fault.Tag, shopPackage, err)
	}
	return bin, nil
}

// checkFaultBuild refuses a shop binary built without the fault points,
// which the crash table and the random kills need.
func checkFaultBuild(bin string) error {
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return fmt.Errorf("--shop %s: %w; give a shop binary built by go build -tags %s ./cmd/shop", bin, err, fault.Tag)
	}
	if info.Path != shopPackage {
		return fmt.Errorf("--shop %s is %s, not the shop (%s)", bin, info.Path, shopPackage)
	}
	for _, st := range info.Settings {
		if st.Key == "-tags" && slices.Contains(strings.Split(st.Value, ","), fault.Tag) {
			return nil
		}
	}
	return fmt.Errorf("--shop %[1]s was built without fault points, which shopctl chaos kills its processes at: build it with -tags %[2]s (go build -tags %[2]s -o shop-chaos ./cmd/shop), or leave --shop out to have shopctl build it", bin, fault.Tag)
}
