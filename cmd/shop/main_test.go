package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idem-go/idem/internal/fault"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/tools/shopkit"
)

// shopBinary is the shop command, built once for the package's tests, with
// the fault points compiled in, as make test builds every package.
var shopBinary string

// httpClient is the tests' client of the shop's HTTP endpoints.
var httpClient = &http.Client{Timeout: 30 * time.Second}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "shop-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	shopBinary = filepath.Join(dir, "shop")
	build := exec.Command("go", "build", "-race", "-tags", fault.Tag, "-o", shopBinary, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build shop:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// TestEndToEndEmbedded runs the shop as "go run ./cmd/shop" does, with no
// database or broker flags: SQLite files and an embedded NATS JetStream
// server under --data-dir.
func TestEndToEndEmbedded(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cl := &shopkit.Cluster{Binary: shopBinary, DataDir: dir, LogDir: t.TempDir()}
	in, err := shopkit.OpenInspector(context.Background(), "sqlite:"+dir, namespaceDefault)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(in.Close)
	banner := endToEnd(t, cl, in)
	for _, want := range []string{filepath.Join(dir, "shop_order.db"), "embedded NATS JetStream", "curl"} {
		if !strings.Contains(banner, want) {
			t.Errorf("the banner does not mention %q:\n%s", want, banner)
		}
	}
	// The dashboard and the status of the running shop, one command each.
	m := regexp.MustCompile(`shop:   dashboard (http://\S+/dashboard/)  \(open it in a browser\)\nshop:   status    go run \./cmd/idem status --dashboard (\S+)\n`).FindStringSubmatch(banner)
	if m == nil || m[1] != m[2] {
		t.Fatalf("the banner does not say how to open the dashboard and the status:\n%s", banner)
	}
}

// TestEndToEnd runs the shop on PostgreSQL + RabbitMQ.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	pg, amqpURL := testdb.PostgresURL(t), testamqp.URL(t)
	ns := "e2e_" + shopkit.RandomSuffix()
	in, err := shopkit.OpenInspector(context.Background(), pg, ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.DropNamespace(); in.Close() })
	endToEnd(t, &shopkit.Cluster{Binary: shopBinary, DB: pg, Broker: amqpURL, Namespace: ns, LogDir: t.TempDir()}, in)
}

// TestEndToEndMariaDB runs the shop on MariaDB (one database per service)
// with the embedded NATS JetStream broker.
func TestEndToEndMariaDB(t *testing.T) {
	t.Parallel()
	my := testdb.MariaDBURL(t)
	ns := "e2e_" + shopkit.RandomSuffix()
	in, err := shopkit.OpenInspector(context.Background(), my, ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.DropNamespace(); in.Close() })
	endToEnd(t, &shopkit.Cluster{Binary: shopBinary, DB: my, Namespace: ns, DataDir: t.TempDir(), LogDir: t.TempDir()}, in)
}

// endToEnd starts the shop as one process, places orders over HTTP, waits
// until shipping has prepared them, stops it with SIGTERM, starts it again
// and checks that the state is kept and new orders still flow. It returns
// the first process's output.
func endToEnd(t *testing.T, cl *shopkit.Cluster, in *shopkit.Inspector) string {
	t.Helper()
	t.Cleanup(cl.StopAll)
	ctx := context.Background()
	p, err := cl.Start(ctx, shopkit.ProcSpec{Name: "shop", Services: "all"})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 3 {
		id, err := shopkit.PlaceOK(ctx, p.HTTP, fmt.Sprintf("c-%d", i), 2)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	for _, id := range ids {
		waitFulfilment(t, p.HTTP, id)
	}
	if err := p.Stop(); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, p.Tail())
	}
	out := p.Stdout()
	if !strings.Contains(out, "shop: stopped") {
		t.Fatalf("no graceful stop in the output:\n%s", out)
	}

	p, err = cl.Start(ctx, shopkit.ProcSpec{Name: "shop", Services: "all", HTTP: p.HTTP})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		var o struct{ Status, Fulfilment string }
		if err := shopkit.GetJSON(ctx, "http://"+p.HTTP+"/orders/"+id, &o); err != nil {
			t.Fatalf("order %s after restart: %v", id, err)
		}
		if o.Status != "confirmed" || o.Fulfilment == "awaiting preparation" {
			t.Errorf("order %s after restart: %+v", id, o)
		}
	}
	id, err := shopkit.PlaceOK(ctx, p.HTTP, "c-after", 1)
	if err != nil {
		t.Fatal(err)
	}
	waitFulfilment(t, p.HTTP, id)
	if obs, ok := in.Settle(ctx, shopkit.SettleTimeout, len(ids)+1); !ok {
		t.Fatalf("%s\nwarnings and errors of the restarted shop:\n%s", obs, p.Problems())
	}
	return out
}

// waitFulfilment polls an order until shipping's events reached it.
func waitFulfilment(t *testing.T, addr, id string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, fulfilment, err := preparing(context.Background(), addr, id)
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("order %s: fulfilment %q after 30s (err %v)", id, fulfilment, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// preparing reads order id's fulfilment, and says whether it reached "in
// preparation" (or later).
func preparing(ctx context.Context, addr, id string) (ok bool, fulfilment string, err error) {
	var o struct{ Fulfilment string }
	err = shopkit.GetJSON(ctx, "http://"+addr+"/orders/"+id, &o)
	return err == nil && (o.Fulfilment == "in preparation" || o.Fulfilment == "shipment requested"), o.Fulfilment, err
}

// TestHelp checks that --help documents the flags and their variables.
func TestHelp(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(shopBinary, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"--services", "SHOP_DB_URL", "SHOP_BROKER_URL", "SHOP_HTTP", "SHOP_STOCK_DB_URL", "SHOP_RELAY", "Examples:", "shopctl load"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("--help does not mention %s", want)
		}
	}
}
