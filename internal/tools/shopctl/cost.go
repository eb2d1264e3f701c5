package main

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/internal/procstat"
	"github.com/idem-go/idem/internal/tools/shopkit"
)

// costSample is what the processes, the shop and the database had spent at
// one moment.
type costSample struct {
	at         time.Time
	cpu        map[int]time.Duration // per --pids process, its tree included
	loader     time.Duration         // shopctl load's own process
	machine    procstat.Machine      // the machine's CPU times (/proc/stat)
	adminCPU   time.Duration         // process_cpu_seconds_total of --admin
	published  float64               // idem_relay_published_total of --admin
	claims     float64               // claims of --admin's relays: claim_duration_seconds_count
	empty      float64               // idem_relay_empty_claims_total of --admin
	wakeups    float64               // idem_relay_wakeups_total of --admin
	xacts      int64                 // pg_stat_database: commits + rollbacks
	statements int64                 // pg_stat_statements: calls
	hasStmts   bool
}

// costProbe takes costSamples of the processes, admin endpoint and
// PostgreSQL database that shopctl load was given.
type costProbe struct {
	pids  []int
	admin string // base URL of the shop's admin address, or ""
	pg    *pgx.Conn
	note  []string // what could not be measured, and how to fix it
}

// newCostProbe checks what it was given: each process exists, the admin
// endpoint answers, and db (when it is a PostgreSQL URL) can be read, with
// pg_stat_statements created when the server has it loaded.
func newCostProbe(ctx context.Context, pids []int, admin, db string) (*costProbe, error) {
	p := &costProbe{pids: pids, admin: strings.TrimSuffix(admin, "/")}
	for _, pid := range pids {
		if _, err := procstat.TreeCPU(pid); err != nil {
			return nil, fmt.Errorf("shopctl load: --pids %d: %v; give the ids of running processes (pgrep -o postgres, pgrep -f beam.smp, pgrep -f 'shop run')", pid, err)
		}
	}
	if p.admin != "" {
		if !strings.Contains(p.admin, "://") {
			p.admin = "http://" + p.admin
		}
		if _, err := p.scrape(ctx); err != nil {
			return nil, fmt.Errorf("shopctl load: --admin %s: %v; give the shop's --admin-addr", admin, err)
		}
	}
	if strings.HasPrefix(db, "postgres://") || strings.HasPrefix(db, "postgresql://") {
		conn, err := pgx.Connect(ctx, db)
		if err != nil {
			return nil, fmt.Errorf("shopctl load: --db: %v", err)
		}
		p.pg = conn
		var loaded bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements')`).Scan(&loaded); err != nil {
			p.close(ctx)
			return nil, fmt.Errorf("shopctl load: --db: %v", err)
		}
		if !loaded {
			if _, err := conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
				p.note = append(p.note, fmt.Sprintf("statements per order: pg_stat_statements cannot be created (%v)", err))
			}
		}
		var n int64
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_statements`).Scan(&n); err != nil {
			p.note = append(p.note, "statements per order not counted: pg_stat_statements is not loaded; add shared_preload_libraries = 'pg_stat_statements' to postgresql.conf and restart PostgreSQL")
		} else if n == 0 {
			p.note = append(p.note, "pg_stat_statements is empty: is pg_stat_statements.track none?")
		}
	}
	return p, nil
}

func (p *costProbe) close(ctx context.Context) {
	if p.pg != nil {
		_ = p.pg.Close(ctx)
	}
}

// sample reads every source; a source that fails leaves its figures out
// and says why in p.note.
func (p *costProbe) sample(ctx context.Context) costSample {
	s := costSample{at: time.Now(), cpu: map[int]time.Duration{}}
	if d, err := procstat.TreeCPU(os.Getpid()); err == nil {
		s.loader = d
	}
	s.machine, _ = procstat.ReadMachine() // zero when unreadable: no figure
	for _, pid := range p.pids {
		d, err := procstat.TreeCPU(pid)
		if err != nil {
			p.note = append(p.note, fmt.Sprintf("process %d: %v", pid, err))
			continue
		}
		s.cpu[pid] = d
	}
	if p.admin != "" {
		m, err := p.scrape(ctx)
		if err != nil {
			p.note = append(p.note, fmt.Sprintf("admin %s: %v", p.admin, err))
		} else {
			s.adminCPU = time.Duration(m["process_cpu_seconds_total"] * float64(time.Second))
			s.published = m["idem_relay_published_total"]
			s.claims = m["idem_relay_claim_duration_seconds_count"]
			s.empty = m["idem_relay_empty_claims_total"]
			s.wakeups = m["idem_relay_wakeups_total"]
		}
	}
	if p.pg != nil {
		if err := p.pg.QueryRow(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()`).Scan(&s.xacts); err != nil {
			p.note = append(p.note, fmt.Sprintf("pg_stat_database: %v", err))
		}
		if err := p.pg.QueryRow(ctx, `SELECT COALESCE(sum(calls), 0)::bigint FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&s.statements); err == nil {
			s.hasStmts = true
		}
	}
	return s
}

// waitDrained waits, at most wait, until the shop's relays have published
// nothing for a second: the orders' events have all left.
func (p *costProbe) waitDrained(ctx context.Context, wait time.Duration) {
	deadline := time.Now().Add(wait)
	last, still := -1.0, 0
	for time.Now().Before(deadline) && still < 4 {
		m, err := p.scrape(ctx)
		if err != nil {
			return
		}
		if v := m["idem_relay_published_total"]; v == last {
			still++
		} else {
			last, still = v, 0
		}
		time.Sleep(250 * time.Millisecond)
	}
	if still < 4 {
		p.note = append(p.note, fmt.Sprintf("the relays were still publishing after --wait %v: the figures leave out what was left", wait))
	}
}

// scrape reads the admin endpoint's /metrics and sums each metric over its
// labels.
func (p *costProbe) scrape(ctx context.Context) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.admin+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return shopkit.ParseMetrics(resp.Body)
}

// loadCost is the cost of a load run, per accepted order.
type loadCost struct {
	Seconds             float64            `json:"seconds"`
	Orders              int                `json:"orders"`
	CPUMsPerOrder       map[string]float64 `json:"cpu_ms_per_order,omitempty"` // per process ("pid 123 (postgres)")
	TotalCPUMsPerOrder  float64            `json:"total_cpu_ms_per_order,omitempty"`
	CoresUsed           float64            `json:"cores_used,omitempty"`
	LoaderCPUMsPerOrder float64            `json:"loader_cpu_ms_per_order,omitempty"` // shopctl load itself
	MachineCoresBusy    float64            `json:"machine_cores_busy,omitempty"`      // every process, of MachineCores
	MachineCores        int                `json:"machine_cores,omitempty"`
	AdminCPUMsPerOrder  float64            `json:"admin_cpu_ms_per_order,omitempty"`
	MessagesPerOrder    float64            `json:"broker_messages_per_order,omitempty"`
	ClaimsPerOrder      float64            `json:"claims_per_order,omitempty"`
	EmptyClaimsPerOrder float64            `json:"empty_claims_per_order,omitempty"`
	WakeupsPerOrder     float64            `json:"wakeups_per_order,omitempty"`
	XactsPerOrder       float64            `json:"transactions_per_order,omitempty"`
	StmtsPerOrder       float64            `json:"statements_per_order,omitempty"`
	Notes               []string           `json:"notes,omitempty"`
}

func (p *costProbe) cost(before, after costSample, orders int) *loadCost {
	c := &loadCost{Seconds: after.at.Sub(before.at).Seconds(), Orders: orders, Notes: p.note}
	if orders == 0 {
		return c
	}
	per := func(d float64) float64 { return d / float64(orders) }
	var total time.Duration
	for _, pid := range p.pids {
		a, okA := after.cpu[pid]
		b, okB := before.cpu[pid]
		if !okA || !okB {
			continue
		}
		if c.CPUMsPerOrder == nil {
			c.CPUMsPerOrder = map[string]float64{}
		}
		c.CPUMsPerOrder[fmt.Sprintf("pid %d (%s)", pid, procName(pid))] = per(float64(a-b) / float64(time.Millisecond))
		total += a - b
	}
	if total > 0 {
		c.TotalCPUMsPerOrder = per(float64(total) / float64(time.Millisecond))
		c.CoresUsed = total.Seconds() / c.Seconds
	}
	if len(p.pids) > 0 || p.admin != "" {
		// What else ran meanwhile: this load, and the machine as a
		// whole, so that a machine-bound run shows as one.
		c.LoaderCPUMsPerOrder = per(float64(after.loader-before.loader) / float64(time.Millisecond))
		if after.machine.Total > before.machine.Total && before.machine.Total > 0 {
			c.MachineCores = runtime.NumCPU()
			c.MachineCoresBusy = before.machine.CoresBusy(after.machine)
		}
	}
	if p.admin != "" {
		c.AdminCPUMsPerOrder = per(float64(after.adminCPU-before.adminCPU) / float64(time.Millisecond))
		c.MessagesPerOrder = per(after.published - before.published)
		c.ClaimsPerOrder = per(after.claims - before.claims)
		c.EmptyClaimsPerOrder = per(after.empty - before.empty)
		c.WakeupsPerOrder = per(after.wakeups - before.wakeups)
	}
	if p.pg != nil {
		// The probe's own two samples are a few transactions and
		// statements: left in, negligible over hundreds of orders.
		c.XactsPerOrder = per(float64(after.xacts - before.xacts))
		if before.hasStmts && after.hasStmts {
			c.StmtsPerOrder = per(float64(after.statements - before.statements))
		}
	}
	return c
}

func procName(pid int) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

// String formats the cost for the load report.
func (c *loadCost) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cost per order (%d orders, %.1f s from the first order to the end of --settle):\n", c.Orders, c.Seconds)
	for _, name := range slices.Sorted(maps.Keys(c.CPUMsPerOrder)) {
		fmt.Fprintf(&b, "  CPU %-28s %8.2f ms\n", name, c.CPUMsPerOrder[name])
	}
	if c.TotalCPUMsPerOrder > 0 {
		fmt.Fprintf(&b, "  CPU of these processes, in all   %8.2f ms (%.2f cores)\n", c.TotalCPUMsPerOrder, c.CoresUsed)
	}
	if c.LoaderCPUMsPerOrder > 0 {
		fmt.Fprintf(&b, "  CPU of shopctl load itself       %8.2f ms\n", c.LoaderCPUMsPerOrder)
	}
	if c.MachineCores > 0 {
		fmt.Fprintf(&b, "  machine, every process           %8.2f of %d cores busy\n", c.MachineCoresBusy, c.MachineCores)
	}
	if c.AdminCPUMsPerOrder > 0 || c.MessagesPerOrder > 0 {
		fmt.Fprintf(&b, "  CPU of the shop (--admin)        %8.2f ms\n", c.AdminCPUMsPerOrder)
		fmt.Fprintf(&b, "  broker messages (relays)         %8.2f\n", c.MessagesPerOrder)
		fmt.Fprintf(&b, "  relay claims (empty ones)        %8.2f (%.2f)\n", c.ClaimsPerOrder, c.EmptyClaimsPerOrder)
		fmt.Fprintf(&b, "  relay wake-ups (notifications)   %8.2f\n", c.WakeupsPerOrder)
	}
	if c.XactsPerOrder > 0 {
		fmt.Fprintf(&b, "  PostgreSQL transactions          %8.2f\n", c.XactsPerOrder)
	}
	if c.StmtsPerOrder > 0 {
		fmt.Fprintf(&b, "  PostgreSQL statements            %8.2f\n", c.StmtsPerOrder)
	}
	for _, n := range c.Notes {
		fmt.Fprintf(&b, "  note: %s\n", n)
	}
	return b.String()
}

// parsePids reads --pids: process ids separated by commas.
func parsePids(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("shopctl load: --pids %q: want process ids separated by commas, such as --pids $(pgrep -o postgres),$(pgrep -f beam.smp)", s)
		}
		out = append(out, n)
	}
	return out, nil
}
