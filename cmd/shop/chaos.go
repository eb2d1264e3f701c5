package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idem-go/idem/broker/nats/embedded"
	"github.com/idem-go/idem/internal/fault"
	"github.com/idem-go/idem/internal/registry"
	"github.com/idem-go/idem/relay"
	"github.com/idem-go/idem/shop/store"
)

// chaosCase is one line of the crash table.
type chaosCase struct {
	// Name is the fault point or situation.
	Name string
	// Expected is what must hold after recovery.
	Expected string
	// Relay, when set, is the --relay of every process of the case; the
	// CDC relay's cases run only on PostgreSQL.
	Relay string
	// Outbox, when set, is the --outbox of every process of the case.
	Outbox string
	run    func(ctx context.Context, r *chaosRun) (string, error)
}

// applies reports whether the case runs on the database at dbURL.
func (c chaosCase) applies(dbURL string) bool {
	return c.Relay != relayCDC || isPostgresURL(dbURL)
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
	*cluster
	in *inspector
}

// allProcs are the services of the "app" process when the relay runs apart.
const appServices = "carrier,order,stock,shipping,billing"

// settleTimeout bounds the wait for every effect after recovery.
const settleTimeout = 45 * time.Second

func (r *chaosRun) app(ctx context.Context, services, fault string) (*proc, error) {
	return r.start(ctx, procSpec{name: strings.ReplaceAll(services, ",", "+"), services: services, fault: fault})
}

func (r *chaosRun) orders(ctx context.Context, addr string, n int) error {
	for i := range n {
		if _, err := placeOK(ctx, addr, fmt.Sprintf("c-%d", i), 1+i%3); err != nil {
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
		var app, armed *proc
		var err error
		if armedFirst {
			if armed, err = r.start(ctx, procSpec{name: split, services: split, fault: fault, carrierURL: "http://" + mustAddr(r) + "/carrier"}); err != nil {
				return "", err
			}
		}
		if app, err = r.start(ctx, procSpec{name: "app", services: strings.Join(rest, ","), http: r.appAddr}); err != nil {
			return "", err
		}
		if !armedFirst {
			if armed, err = r.start(ctx, procSpec{name: split, services: split, fault: fault}); err != nil {
				return "", err
			}
		}
		if err := r.orders(ctx, app.http, n); err != nil {
			return "", err
		}
		if err := armed.waitKilled(30 * time.Second); err != nil {
			return "", err
		}
		spec := procSpec{name: split, services: split}
		if armedFirst {
			spec.carrierURL = "http://" + app.http + "/carrier"
		}
		if _, err := r.start(ctx, spec); err != nil {
			return "", err
		}
		obs, ok := r.in.settle(ctx, settleTimeout, n)
		if !ok {
			return obs, errors.New(obs)
		}
		return "killed, restarted; " + obs, nil
	}
}

func mustAddr(r *chaosRun) string {
	if r.appAddr == "" {
		r.appAddr, _ = freeAddr()
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
			if _, err := placeOrder(ctx, app.http, "chaos-key-1", "c-1", 2); err == nil {
				return "", errors.New("the order request succeeded although the process should have died before its commit")
			}
			if err := app.waitKilled(10 * time.Second); err != nil {
				return "", err
			}
			if _, err := r.start(ctx, procSpec{name: "app", services: appServices + ",relay", http: app.http}); err != nil {
				return "", err
			}
			// The key's claim was in the crashed request's transaction: it
			// rolled back with the order, and the retry runs at once. (A
			// claim left "processing" by an older binary answers 409 until
			// the lock timeout, 1s here, then the retry takes it over.)
			conflicts := 0
			deadline := time.Now().Add(15 * time.Second)
			for {
				res, err := placeOrder(ctx, app.http, "chaos-key-1", "c-1", 2)
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
			if err := r.orders(ctx, app.http, 2); err != nil {
				return "", err
			}
			obs, ok := r.in.settle(ctx, settleTimeout, 3)
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
		Expected: "CDC relay: received from the slot, nothing published: the restarted relay reads it again and publishes it",
		Relay:    relayCDC,
		run:      crashAndRecover("relay", fault.CDCAfterReceive, 3),
	},
	{
		Name:     fault.CDCAfterPublishBeforeConfirm,
		Expected: "CDC relay: published, slot position not confirmed: republished (duplicate source 1), consumers skip the copies",
		Relay:    relayCDC,
		run:      crashAndRecover("relay", fault.CDCAfterPublishBeforeConfirm, 3),
	},
	{
		Name:     fault.CDCAfterConfirm,
		Expected: "CDC relay: position confirmed: the restarted relay resumes after it, nothing lost",
		Relay:    relayCDC,
		run:      crashAndRecover("relay", fault.CDCAfterConfirm, 3),
	},
	{
		Name:     fault.CDCAfterPublishBeforeConfirm + " (WAL messages)",
		Expected: "events written as WAL messages (--outbox log), no outbox row: republished, consumers skip the copies",
		Relay:    relayCDC,
		Outbox:   outboxLog,
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
		if _, err := r.start(ctx, procSpec{name: fmt.Sprintf("shipping%d", i+1), services: "shipping", carrierURL: "http://" + addr + "/carrier"}); err != nil {
			return "", err
		}
	}
	app, err := r.start(ctx, procSpec{name: "app", services: "carrier,order,stock,billing,relay", http: addr})
	if err != nil {
		return "", err
	}
	if err := r.orders(ctx, app.http, 4); err != nil {
		return "", err
	}
	if obs, ok := r.in.settle(ctx, settleTimeout, 4); !ok {
		return obs, errors.New(obs)
	}
	n, err := r.replay(ctx, 2)
	if err != nil {
		return "", err
	}
	obs, ok := r.in.settle(ctx, settleTimeout, 4)
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
	if err := postJSON(ctx, "http://"+app.http+"/carrier/control", map[string]int{"drop_responses": 3}); err != nil {
		return "", err
	}
	if err := r.orders(ctx, app.http, 3); err != nil {
		return "", err
	}
	obs, ok := r.in.settle(ctx, settleTimeout, 3)
	if !ok {
		return obs, errors.New(obs)
	}
	var st struct {
		Dropped int `json:"dropped"`
	}
	if err := getJSON(ctx, "http://"+app.http+"/carrier/stats", &st); err != nil {
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
	if err := r.orders(ctx, app.http, 3); err != nil {
		return "", err
	}
	if obs, ok := r.in.settle(ctx, settleTimeout, 3); !ok {
		return obs, errors.New(obs)
	}
	n, err := r.replay(ctx, 1)
	if err != nil {
		return "", err
	}
	obs, ok := r.in.settle(ctx, settleTimeout, 3)
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

func (d duplicating) Publish(ctx context.Context, msgs []idemMessage) error {
	var out []idemMessage
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
	pub, err := registry.OpenPrefixed(ctx, r.broker, r.namespace)
	if err != nil {
		return 0, err
	}
	defer pub.Close()
	n, err := relay.Replay(ctx, r.in.dbs["order"].Driver, duplicating{pub, copies},
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

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
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
		ns := "chaos_" + randomSuffix()
		res := chaosResult{Case: c}
		func() {
			cl := &cluster{binary: o.Binary, db: o.DB, broker: o.Broker, namespace: ns, logDir: o.LogDir, relay: c.Relay, outbox: c.Outbox}
			defer cl.stopAll()
			in, err := openInspector(ctx, o.DB, ns)
			if err != nil {
				res.Err = err
				return
			}
			in.outboxRowsDeleted = c.Relay == relayCDC
			defer in.close()
			// The processes stop before their namespace goes: a CDC
			// relay's slot can be dropped only once nobody reads it.
			defer func() { cl.stopAll(); dropNamespace(in) }()
			res.Observed, res.Err = c.run(ctx, &chaosRun{cluster: cl, in: in})
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

func matchesAny(name, words string) bool {
	for _, w := range strings.Split(words, ",") {
		if w = strings.TrimSpace(w); w != "" && strings.Contains(name, w) {
			return true
		}
	}
	return false
}

// dropNamespace removes the schemas (PostgreSQL) or databases (MySQL) of a
// finished case, and on PostgreSQL the replication slots and publications
// of its CDC relays: a slot left behind would keep the server's WAL
// forever. The namespace's processes must have stopped. SQLite files stay
// in their directory, which the caller removes.
func dropNamespace(in *inspector) {
	for _, db := range in.dbs {
		switch db.Dialect {
		case store.Postgres:
			dropSlot(db)
			_, _ = db.SQL.Exec(`DROP SCHEMA IF EXISTS ` + db.Schema + ` CASCADE`)
		case store.MySQL:
			_, _ = db.SQL.Exec("DROP DATABASE IF EXISTS `" + db.Schema + "`")
		}
	}
}

// dropSlot drops the CDC slot of db's service, waiting a few seconds for
// the server to notice that a relay which just exited is gone (its slot is
// active until then).
func dropSlot(db *store.DB) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := db.DropCDCSlot(ctx)
		cancel()
		if err == nil || time.Now().After(deadline) {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// embeddedChaos returns the settings of the crash table on the embedded
// defaults: SQLite files under dir, shared by the shop processes, and a NATS
// JetStream server run by this process (the processes it kills cannot own
// it) with its data under dir, listening on a free local port. stop stops
// the server.
func embeddedChaos(ctx context.Context, dir string) (db, brokerURL string, stop func(), err error) {
	srv, err := embedded.Start(ctx, embedded.Config{Dir: filepath.Join(dir, "nats"), Listen: "127.0.0.1:0"})
	if err != nil {
		return "", "", nil, err
	}
	// A short ack_wait has a killed consumer's messages delivered again soon.
	return "sqlite:" + filepath.Join(dir, "db"), srv.ClientURL() + "?ack_wait=3s", func() { _ = srv.Shutdown(context.Background()) }, nil
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
		if len(obs) > 200 {
			obs = obs[:200] + "..."
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Case.Name, r.Case.Expected, obs, status)
	}
	_ = tw.Flush()
	return failed
}

var chaosEnv = map[string]string{"db": "SHOP_DB_URL", "broker": "SHOP_BROKER_URL"}

func chaosMain(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("shop chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o chaosOptions
	fs.StringVar(&o.DB, "db", "", "database URL the shop processes use (each case gets its own schemas); default: SQLite files in a temporary directory")
	fs.StringVar(&o.Broker, "broker", "", "broker URL (each case gets its own exchange and queues); default: a NATS JetStream server run by shop chaos")
	fs.StringVar(&o.Only, "only", "", "run only the cases whose name contains one of these comma-separated words")
	keep := fs.Bool("keep-logs", false, "keep the processes' logs (their directory is printed)")
	ro := randomDefaults
	fs.DurationVar(&ro.Duration, "random", 0, "instead of the crash table, kill the shop's processes at random for this long, under load (see below)")
	fs.Float64Var(&ro.Rate, "rate", ro.Rate, "with --random: orders per second placed while processes are killed")
	fs.DurationVar(&ro.KillMin, "kill-min", ro.KillMin, "with --random: the shortest wait before a kill")
	fs.DurationVar(&ro.KillMax, "kill-max", ro.KillMax, "with --random: the longest wait before a kill")
	fs.Uint64Var(&ro.Seed, "seed", 0, "with --random: the seed of the kill schedule (0: a random one, printed)")
	fs.DurationVar(&ro.Settle, "settle", ro.Settle, "with --random: how long to wait for every effect once the kills stop")
	fs.StringVar(&ro.Relay, "relay", "", "with --random: the relays' --relay (poll, or cdc on PostgreSQL)")
	fs.StringVar(&ro.Outbox, "outbox", "", "with --random: the services' --outbox (rows, or log with --relay cdc)")
	fs.IntVar(&ro.Replicas, "replicas", ro.Replicas, "with --random: processes of each service (consumers, relays, order API); replicas of a consumer\nshare its queue: the extra ones stand by, or share its partitions when the broker URL sets them")
	fs.IntVar(&ro.Partitions, "partitions", 0, "with --random: partition each consumer's queue (RabbitMQ) or the stream (NATS) in this many\npartitions, which the replicas of a consumer share (adds partitions=N to the broker URL)")
	fs.Usage = usageWithEnv(fs, chaosEnv, `Usage: shop chaos [flags]

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
shop broker), places
--rate orders per second, each retried with its Idempotency-Key until it
is accepted, as a client whose request failed would, and for DURATION
kills one process at random with SIGKILL every --kill-min to --kill-max,
restarting it at once. Orders go to the order API's replicas in turn. Then
it waits for every effect and checks, from the databases: every accepted
order committed once with all its effects and
nothing for an order never accepted, no message parked by a consumer, no
outbox row quarantined by a relay, every invoice marked e-mailed. It
prints a verdict table and fails if a check fails.

Fault points exist only in a shop built with the build tag idemfault: run
shop chaos from such a build (go run -tags idemfault ./cmd/shop chaos, or
go build -tags idemfault -o shop-chaos ./cmd/shop). A plain build refuses.

Flags:
`, `
With no --db and --broker, the processes share SQLite files in a temporary
directory and a NATS JetStream server that shop chaos runs itself (with
--random, as a process of its own that it kills and restarts too). On Kafka,
give the consumers a short session timeout (?session_timeout=6s): a killed
consumer keeps its partitions until its session expires, 45s by default,
which is as long as a case waits for its effects after the restart.

Examples:
  go run -tags idemfault ./cmd/shop chaos
  shop-chaos chaos --db postgres://postgres@localhost/shop --broker amqp://guest:guest@localhost:5672/
  shop-chaos chaos --db mysql://root@localhost:3306/shop --broker 'kafka://localhost:9092?session_timeout=6s'
  shop-chaos chaos --random 2m --rate 30 --relay cdc --db postgres://postgres@localhost/shop --broker amqp://guest:guest@localhost:5672/
`)
	if err := envFlags(fs, args, chaosEnv); err != nil {
		return err
	}
	if (o.DB == "") != (o.Broker == "") {
		return errors.New("shop chaos needs both --db and --broker, or neither (the embedded defaults)")
	}
	if err := ro.check(o.DB, fs); err != nil {
		return err
	}
	if !fault.Enabled {
		return fmt.Errorf("this shop was built without fault points, which shop chaos kills its processes at: build it with -tags %[1]s (go run -tags %[1]s ./cmd/shop chaos)", fault.Tag)
	}
	bin, err := os.Executable()
	if err != nil {
		return err
	}
	o.Binary = bin
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
		defer os.RemoveAll(dir)
		if ro.Duration > 0 {
			// Random kills run the broker as a process, to kill it too.
			o.DB, ro.BrokerDir = "sqlite:"+filepath.Join(dir, "db"), dir
			fmt.Fprintf(stdout, "embedded defaults: database %s, broker: shop broker with its data in %s\n", o.DB, dir)
		} else {
			var stop func()
			if o.DB, o.Broker, stop, err = embeddedChaos(context.Background(), dir); err != nil {
				return err
			}
			defer stop()
			fmt.Fprintf(stdout, "embedded defaults: database %s, broker %s\n", o.DB, o.Broker)
		}
	}
	o.Progress = stderr
	if ro.Duration > 0 {
		ro.Binary, ro.DB, ro.Broker, ro.LogDir, ro.Progress = o.Binary, o.DB, o.Broker, o.LogDir, stderr
		rep, err := runRandom(context.Background(), ro)
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
