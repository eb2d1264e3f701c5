package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem/internal/envflag"
	"github.com/idem-go/idem/internal/tools/shopkit"
	"github.com/idem-go/idem/shop/store"
)

var loadEnv = map[string]string{"url": "SHOP_URL", "db": "SHOP_DB_URL", "namespace": "SHOP_NAMESPACE"}

type loadOptions struct {
	URL         string
	Orders      int
	Concurrency int
	RetryRate   float64
	Rate        float64
	Lines       int
	DB          string
	Namespace   string
	Wait        time.Duration
	Pids        []int
	Admin       string
	Settle      time.Duration
	JSON        bool
	// Rates, when set, makes a sweep: one run per rate, SweepSeconds long
	// (0: unpaced, --orders orders), and a table of them at the end.
	Rates        []float64
	SweepSeconds float64
}

func loadMain(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("shopctl load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o loadOptions
	fs.StringVar(&o.URL, "url", "http://127.0.0.1:8080", "base URL of the order API")
	fs.IntVar(&o.Orders, "orders", 1000, "number of orders to place")
	fs.IntVar(&o.Concurrency, "concurrency", 16, "concurrent clients")
	fs.Float64Var(&o.RetryRate, "retry-rate", 0, "share of orders sent a second time with the same Idempotency-Key, as a client whose first answer timed out would (0 to 1)")
	fs.Float64Var(&o.Rate, "rate", 0, "orders per second to aim at; 0 sends as fast as the clients can")
	fs.IntVar(&o.Lines, "lines", 2, "lines per order")
	fs.StringVar(&o.DB, "db", "", "database URL of the shop; when set, also reports the delay from order commit to preparation commit")
	fs.StringVar(&o.Namespace, "namespace", shopkit.NamespaceDefault, "namespace of the shop's schemas, with --db")
	fs.DurationVar(&o.Wait, "wait", 2*time.Minute, "with --db, how long to wait for the preparations")
	pids := fs.String("pids", "", "process ids whose CPU time per order to report, each with its child processes (PostgreSQL's postmaster, RabbitMQ's beam.smp, the shop), separated by commas")
	fs.StringVar(&o.Admin, "admin", "", "the shop's admin address (its --admin-addr): report its CPU per order (process_cpu_seconds_total) and the broker messages its relays published per order")
	fs.DurationVar(&o.Settle, "settle", 3*time.Second, "with --pids or --admin, how long to go on measuring after the last order (with --db, after its preparation; with --admin, after the relays stopped publishing), so that the consumers' work is counted")
	fs.BoolVar(&o.JSON, "json", false, "print the report as JSON")
	rates := fs.String("rates", "", "a sweep: one run per rate of this list, separated by commas (0 for unpaced, with --orders orders), each --sweep-seconds long, then a table of the cost and the latency at each rate; such as --rates 10,25,50,100,200,0")
	fs.Float64Var(&o.SweepSeconds, "sweep-seconds", 20, "with --rates, how long each paced run lasts (its orders: rate x seconds, at least 50)")
	fs.Usage = envflag.Usage(fs, loadEnv, `Usage: shopctl load [flags]

Places orders through the order API, each with an Idempotency-Key, retries a
share of them with the same key, and prints the throughput and the latency
percentiles of the accepted orders. With --db, it then waits for shipping to
prepare every order and prints the delay from order commit to preparation
commit.

It also reports what an order costs, measured from the first order to
--settle after the last one (idle work included):
  --pids       CPU ms per order of each process and its children, from
               /proc/<pid>/stat (the PostgreSQL postmaster's tree holds
               every backend; RabbitMQ's is beam.smp's); with --pids or
               --admin, also the CPU of shopctl load itself and how many of
               the machine's cores were busy (/proc/stat), which tells a
               run bounded by the machine from one that is not
  --admin      the shop's own CPU ms per order and the broker messages its
               relays published per order, from its /metrics
  --db         with a PostgreSQL URL, transactions per order
               (pg_stat_database) and statements per order
               (pg_stat_statements, created when the server loads it:
               shared_preload_libraries = 'pg_stat_statements'); the
               counts are the whole database's, so run nothing else on it

Flags:
`, `
Examples:
  go run ./internal/tools/shopctl load --orders 10000 --concurrency 64 --retry-rate 0.05
  shopctl load --orders 2000 --rate 200 --db postgres://localhost/shop
  shopctl load --rates 10,25,50,100,200,0 --orders 3000 --db postgres://localhost/shop \
      --admin 127.0.0.1:9090 --pids $(pgrep -o postgres),$(pgrep -f beam.smp),$(pgrep -f 'shop$')
  shopctl load --orders 6000 --rate 200 --db postgres://localhost/shop \
      --admin 127.0.0.1:9090 --pids $(pgrep -o postgres),$(pgrep -f beam.smp) --json
`)
	if err := envflag.Parse(fs, args, loadEnv); err != nil {
		return err
	}
	var err error
	if o.Pids, err = parsePids(*pids); err != nil {
		return err
	}
	if o.Rates, err = parseRates(*rates); err != nil {
		return err
	}
	if len(o.Rates) > 0 {
		return sweep(context.Background(), o, stdout)
	}
	if o.Orders < 1 || o.Concurrency < 1 || o.RetryRate < 0 || o.RetryRate > 1 || o.Lines < 1 {
		return errors.New("shopctl load: want --orders >= 1, --concurrency >= 1, --lines >= 1 and 0 <= --retry-rate <= 1")
	}
	rep, err := runLoad(context.Background(), o)
	if err != nil {
		return err
	}
	if o.JSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep.json())
	}
	fmt.Fprint(stdout, rep.String())
	return nil
}

// parseRates reads --rates: orders per second separated by commas, 0 for
// unpaced.
func parseRates(s string) ([]float64, error) {
	var out []float64
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		r, err := strconv.ParseFloat(f, 64)
		if err != nil || r < 0 {
			return nil, fmt.Errorf("shopctl load: --rates %q: want orders per second separated by commas, 0 for unpaced, such as --rates 10,25,50,100,200,0", s)
		}
		out = append(out, r)
	}
	return out, nil
}

// sweep runs one load per rate of o.Rates, printing each report as it ends,
// then a table of them: the cost and latency curve.
func sweep(ctx context.Context, o loadOptions, stdout io.Writer) error {
	type step struct {
		rate float64
		rep  loadReport
	}
	var steps []step
	for _, rate := range o.Rates {
		run := o
		run.Rate = rate
		if rate > 0 {
			run.Orders = max(50, int(rate*o.SweepSeconds))
		}
		fmt.Fprintf(stdout, "--- rate %s: %d orders\n", rateName(rate), run.Orders)
		rep, err := runLoad(ctx, run)
		if err != nil {
			return fmt.Errorf("rate %s: %w", rateName(rate), err)
		}
		fmt.Fprint(stdout, rep.String())
		steps = append(steps, step{rate, rep})
	}
	if o.JSON {
		var out []map[string]any
		for _, s := range steps {
			j := s.rep.json()
			j["rate"] = s.rate
			out = append(out, j)
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	fmt.Fprintf(stdout, "\nsweep: CPU ms per order of each --pids process, in all; per order: PostgreSQL transactions, statements, relay claims, empty claims, wake-ups; order commit -> preparation p50/p90/p99 (ms)\n")
	fmt.Fprintf(stdout, "%8s %8s  %-26s %6s %6s %6s %6s %6s %6s %8s %8s %8s\n", "rate", "orders/s", "CPU ms/order by process", "CPU", "xacts", "stmts", "claims", "empty", "wakes", "p50", "p90", "p99")
	for _, s := range steps {
		var procs []string
		c := s.rep.Cost
		if c == nil {
			c = &loadCost{}
		}
		for _, name := range slices.Sorted(maps.Keys(c.CPUMsPerOrder)) {
			procs = append(procs, fmt.Sprintf("%.1f", c.CPUMsPerOrder[name]))
		}
		ms := func(p float64) string {
			if len(s.rep.ToPreparation) == 0 {
				return "-"
			}
			return fmt.Sprintf("%.1f", float64(percentile(s.rep.ToPreparation, p))/float64(time.Millisecond))
		}
		fmt.Fprintf(stdout, "%8s %8.1f  %-26s %6.1f %6.1f %6.1f %6.2f %6.2f %6.2f %8s %8s %8s\n", rateName(s.rate),
			float64(s.rep.Accepted)/s.rep.Elapsed.Seconds(), strings.Join(procs, " "), c.TotalCPUMsPerOrder,
			c.XactsPerOrder, c.StmtsPerOrder, c.ClaimsPerOrder, c.EmptyClaimsPerOrder, c.WakeupsPerOrder, ms(.5), ms(.9), ms(.99))
	}
	if len(steps) > 0 && steps[0].rep.Cost != nil {
		fmt.Fprintf(stdout, "processes (in the order of the columns): %s\n", strings.Join(slices.Sorted(maps.Keys(steps[0].rep.Cost.CPUMsPerOrder)), ", "))
	}
	return nil
}

func rateName(r float64) string {
	if r == 0 {
		return "unpaced"
	}
	return strconv.FormatFloat(r, 'f', -1, 64) + "/s"
}

// loadReport is the result of a load run.
type loadReport struct {
	Accepted, Failed, Retries, Replayed, Conflicts int
	Elapsed                                        time.Duration
	Latency                                        []time.Duration
	ToPreparation                                  []time.Duration
	Cost                                           *loadCost
}

// json is the report as --json prints it: durations in milliseconds.
func (r loadReport) json() map[string]any {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	lat := func(d []time.Duration) map[string]float64 {
		return map[string]float64{"p50": ms(percentile(d, .5)), "p90": ms(percentile(d, .9)), "p99": ms(percentile(d, .99)), "max": ms(percentile(d, 1))}
	}
	out := map[string]any{
		"orders_accepted": r.Accepted, "failed": r.Failed, "retries": r.Retries, "replayed": r.Replayed, "conflicts": r.Conflicts,
		"seconds": r.Elapsed.Seconds(), "orders_per_second": float64(r.Accepted) / r.Elapsed.Seconds(),
		"latency_ms": lat(r.Latency),
	}
	if len(r.ToPreparation) > 0 {
		out["to_preparation_ms"] = lat(r.ToPreparation)
	}
	if r.Cost != nil {
		out["cost"] = r.Cost
	}
	return out
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	i := int(float64(len(d)-1) * p)
	return d[i]
}

// String formats the report.
func (r loadReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "orders accepted: %d in %v: %.0f orders/s\n", r.Accepted, r.Elapsed.Round(time.Millisecond), float64(r.Accepted)/r.Elapsed.Seconds())
	fmt.Fprintf(&b, "failed: %d; retries with the same key: %d (replayed %d, 409 %d)\n", r.Failed, r.Retries, r.Replayed, r.Conflicts)
	fmt.Fprintf(&b, "POST /orders latency: p50 %v p90 %v p99 %v max %v\n", pct(r.Latency, .5), pct(r.Latency, .9), pct(r.Latency, .99), pct(r.Latency, 1))
	if len(r.ToPreparation) > 0 {
		fmt.Fprintf(&b, "order commit -> preparation commit: p50 %v p90 %v p99 %v max %v (%d orders)\n",
			pct(r.ToPreparation, .5), pct(r.ToPreparation, .9), pct(r.ToPreparation, .99), pct(r.ToPreparation, 1), len(r.ToPreparation))
	}
	if r.Cost != nil {
		b.WriteString(r.Cost.String())
	}
	return b.String()
}

func pct(d []time.Duration, p float64) time.Duration {
	return percentile(d, p).Round(10 * time.Microsecond)
}

func runLoad(ctx context.Context, o loadOptions) (loadReport, error) {
	addr := strings.TrimPrefix(strings.TrimPrefix(strings.TrimSuffix(o.URL, "/"), "http://"), "https://")
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: o.Concurrency * 2}}
	defer client.CloseIdleConnections()

	var (
		next                                              atomic.Int64
		mu                                                sync.Mutex
		rep                                               loadReport
		ids                                               []string
		failed, retries, replayed, conflicts, acceptedCnt atomic.Int64
	)
	var (
		probe  *costProbe
		before costSample
	)
	if len(o.Pids) > 0 || o.Admin != "" || o.DB != "" {
		var err error
		if probe, err = newCostProbe(ctx, o.Pids, o.Admin, o.DB); err != nil {
			return loadReport{}, err
		}
		defer probe.close(context.WithoutCancel(ctx))
		before = probe.sample(ctx)
	}
	var pace <-chan time.Time
	if o.Rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / o.Rate))
		defer t.Stop()
		pace = t.C
	}
	start := time.Now()
	var wg sync.WaitGroup
	for range o.Concurrency {
		wg.Go(func() {
			var lat []time.Duration
			var mine []string
			for next.Add(1) <= int64(o.Orders) {
				if pace != nil {
					<-pace
				}
				key := uuid.NewString()
				t0 := time.Now()
				r, err := shopkit.PlaceOrderWith(ctx, client, addr, key, "load", o.Lines)
				if err != nil || r.Status != http.StatusCreated {
					failed.Add(1)
					continue
				}
				lat = append(lat, time.Since(t0))
				acceptedCnt.Add(1)
				mine = append(mine, r.ID)
				if rand.Float64() < o.RetryRate {
					retries.Add(1)
					r2, err := shopkit.PlaceOrderWith(ctx, client, addr, key, "load", o.Lines)
					switch {
					case err == nil && r2.Status == http.StatusCreated && r2.Replayed && r2.ID == r.ID:
						replayed.Add(1)
					case err == nil && r2.Status == http.StatusConflict:
						conflicts.Add(1)
					default:
						failed.Add(1)
					}
				}
			}
			mu.Lock()
			rep.Latency = append(rep.Latency, lat...)
			ids = append(ids, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	rep.Elapsed = time.Since(start)
	rep.Accepted, rep.Failed = int(acceptedCnt.Load()), int(failed.Load())
	rep.Retries, rep.Replayed, rep.Conflicts = int(retries.Load()), int(replayed.Load()), int(conflicts.Load())
	slices.Sort(rep.Latency)
	if o.DB != "" && len(ids) > 0 {
		d, err := preparationDelays(ctx, o, ids)
		if err != nil {
			return rep, err
		}
		rep.ToPreparation = d
	}
	if probe != nil {
		if o.Admin != "" {
			probe.waitDrained(ctx, o.Wait)
		}
		if len(o.Pids) > 0 || o.Admin != "" {
			time.Sleep(o.Settle)
		}
		rep.Cost = probe.cost(before, probe.sample(ctx), rep.Accepted)
	}
	return rep, nil
}

// preparationDelays waits until shipping prepared every order of ids and
// returns, sorted, the delays between each order's commit (orders.created_at,
// taken just before the commit) and its preparation's (preparation.created_at).
func preparationDelays(ctx context.Context, o loadOptions, ids []string) ([]time.Duration, error) {
	orderDB, err := store.Open(ctx, "order", o.DB, o.Namespace+"_order", store.Options{MaxConns: 2})
	if err != nil {
		return nil, err
	}
	defer orderDB.Close()
	shipDB, err := store.Open(ctx, "shipping", o.DB, o.Namespace+"_shipping", store.Options{MaxConns: 2})
	if err != nil {
		return nil, err
	}
	defer shipDB.Close()
	// Every dialect reads the whole tables and keeps this run's orders (no
	// array parameters on MySQL or SQLite).
	wanted := make(map[string]bool, len(ids))
	for _, id := range ids {
		wanted[id] = true
	}
	deadline := time.Now().Add(o.Wait)
	prepared := map[string]time.Time{}
	for {
		rows, err := shipDB.SQL.QueryContext(ctx, `SELECT order_id, created_at FROM preparation`)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var id string
			var at time.Time
			if err := rows.Scan(&id, &at); err != nil {
				rows.Close()
				return nil, err
			}
			if wanted[id] {
				prepared[id] = at
			}
		}
		if err := rows.Err(); err != nil {
			rows.Close()
			return nil, err
		}
		rows.Close()
		if len(prepared) == len(ids) {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d orders prepared after %v", len(prepared), len(ids), o.Wait)
		}
		time.Sleep(200 * time.Millisecond)
	}
	rows, err := orderDB.SQL.QueryContext(ctx, `SELECT id, created_at FROM orders`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []time.Duration
	for rows.Next() {
		var id string
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			return nil, err
		}
		if p, ok := prepared[id]; ok {
			out = append(out, p.Sub(at))
		}
	}
	slices.Sort(out)
	return out, rows.Err()
}
