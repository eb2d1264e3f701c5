package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/tools/shopkit"
)

// TestParsePids: --pids takes process ids separated by commas, and says
// what it wants otherwise.
func TestParsePids(t *testing.T) {
	t.Parallel()
	if got, err := parsePids(" 12, 34,"); err != nil || len(got) != 2 || got[0] != 12 || got[1] != 34 {
		t.Fatalf("parsePids: %v, %v", got, err)
	}
	for _, bad := range []string{"12,x", "0", "-3"} {
		if _, err := parsePids(bad); err == nil || !strings.Contains(err.Error(), "want process ids") {
			t.Errorf("parsePids(%q): %v, want an error saying what --pids wants", bad, err)
		}
	}
}

// TestLoadCost runs shopctl load against the shop on PostgreSQL + RabbitMQ
// with --pids (the shop process), --admin and --db: every figure of the
// cost is there and plausible (the database is shared with other tests,
// so its counts are lower bounds).
func TestLoadCost(t *testing.T) {
	t.Parallel()
	pg, amqpURL := testdb.PostgresURL(t), testamqp.URL(t)
	ns := "cost_" + shopkit.RandomSuffix()
	in, err := shopkit.OpenInspector(context.Background(), pg, ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.DropNamespace(); in.Close() })
	admin, err := shopkit.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	cl := &shopkit.Cluster{Binary: shopBinary, DB: pg, Broker: amqpURL, Namespace: ns, LogDir: t.TempDir(), ExtraEnv: []string{"SHOP_ADMIN_ADDR=" + admin}}
	t.Cleanup(cl.StopAll)
	p, err := cl.Start(context.Background(), shopkit.ProcSpec{Name: "shop", Services: "all"})
	if err != nil {
		t.Fatal(err)
	}
	const orders = 40
	rep, err := runLoad(context.Background(), loadOptions{
		URL: "http://" + p.HTTP, Orders: orders, Concurrency: 4, Lines: 2, DB: pg, Namespace: ns, Wait: time.Minute,
		Pids: []int{p.Pid()}, Admin: admin, Settle: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	c := rep.Cost
	if rep.Accepted != orders || c == nil {
		t.Fatalf("report %+v", rep)
	}
	t.Logf("%s", rep)
	if c.TotalCPUMsPerOrder <= 0 || c.AdminCPUMsPerOrder <= 0 {
		t.Errorf("CPU per order: processes %v ms, admin %v ms; want both", c.TotalCPUMsPerOrder, c.AdminCPUMsPerOrder)
	}
	// shopctl load's own CPU, and the machine's, so that a run bounded by
	// the machine shows as one.
	if c.LoaderCPUMsPerOrder <= 0 || c.MachineCores <= 0 || c.MachineCoresBusy <= 0 || c.MachineCoresBusy > float64(c.MachineCores)+0.01 {
		t.Errorf("shopctl load's CPU %v ms per order, machine %v of %d cores busy; want the three, busy at most the cores",
			c.LoaderCPUMsPerOrder, c.MachineCoresBusy, c.MachineCores)
	}
	// order.placed, then stock's, shipping's and billing's events.
	if c.MessagesPerOrder < 3 {
		t.Errorf("%.2f broker messages per order, want at least 3", c.MessagesPerOrder)
	}
	// Every message was claimed, and the relays were woken by notifications
	// (the shop's relays listen on PostgreSQL).
	if c.ClaimsPerOrder-c.EmptyClaimsPerOrder <= 0 || c.WakeupsPerOrder <= 0 {
		t.Errorf("%.2f claims per order of which %.2f empty, %.2f wake-ups: want claims that found rows and wake-ups", c.ClaimsPerOrder, c.EmptyClaimsPerOrder, c.WakeupsPerOrder)
	}
	if c.XactsPerOrder < 4 {
		t.Errorf("%.2f transactions per order, want at least one per service", c.XactsPerOrder)
	}
	// Both counters are the server's, which the other test packages share
	// while this one runs: their ratio is not this shop's; that both were
	// read is what this checks.
	if c.StmtsPerOrder <= 0 {
		t.Errorf("%.2f statements per order for %.2f transactions (notes %q): pg_stat_statements not read?", c.StmtsPerOrder, c.XactsPerOrder, c.Notes)
	}
	for _, want := range []string{"cost per order", "PostgreSQL transactions", "PostgreSQL statements", "broker messages", "relay claims", "wake-ups", "shopctl load itself", "cores busy"} {
		if !strings.Contains(rep.String(), want) {
			t.Errorf("the report has no %q:\n%s", want, rep)
		}
	}
}

// TestParseRates: --rates takes orders per second separated by commas, 0
// for unpaced, and says what it wants otherwise.
func TestParseRates(t *testing.T) {
	t.Parallel()
	if got, err := parseRates("10, 2.5,0,"); err != nil || len(got) != 3 || got[0] != 10 || got[1] != 2.5 || got[2] != 0 {
		t.Fatalf("parseRates: %v, %v", got, err)
	}
	for _, bad := range []string{"10,x", "-1"} {
		if _, err := parseRates(bad); err == nil || !strings.Contains(err.Error(), "want orders per second") {
			t.Errorf("parseRates(%q): %v, want an error saying what --rates wants", bad, err)
		}
	}
}
