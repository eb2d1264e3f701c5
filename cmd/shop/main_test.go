package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idem-go/idem/internal/fault"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
)

// shopBinary is the shop command, built once for the package's tests, with
// fault points: the crash table kills its processes at them.
var shopBinary string

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

// TestChaosPostgresRabbitMQ runs the whole crash table on PostgreSQL +
// RabbitMQ with real processes killed at named fault points.
func TestChaosPostgresRabbitMQ(t *testing.T) {
	t.Parallel()
	pg, amqpURL := testdb.PostgresURL(t), testamqp.URL(t)
	results := runChaos(context.Background(), chaosOptions{Binary: shopBinary, DB: pg, Broker: amqpURL, LogDir: t.TempDir()})
	// Every case, the CDC relay's included.
	checkChaos(t, results, len(chaosCases))
}

// chaosSubset are the cases run on PostgreSQL + Kafka, while the embedded
// defaults, PostgreSQL + RabbitMQ and MariaDB + Kafka run the whole table:
// one per source of duplicates that depends on the transport (relay
// republish, broker redelivery after a commit) and the external effect
// (carrier answer lost). The whole table on every combination would take
// the package past its time budget.
const chaosSubset = "relay.after-publish-before-mark,inbox.after-commit-before-ack,carrier answer lost"

func checkChaos(t *testing.T, results []chaosResult, want int) {
	t.Helper()
	var b strings.Builder
	failed := printTable(&b, results)
	t.Log("\n" + b.String())
	if failed > 0 {
		t.Errorf("%d of %d cases failed", failed, len(results))
	}
	if len(results) != want {
		t.Errorf("%d cases ran, want %d", len(results), want)
	}
}

// TestChaosEmbedded runs the whole crash table on the embedded defaults:
// SQLite files shared by the shop processes, and a NATS JetStream server run
// by the test (the processes it kills cannot own it). JetStream drops a copy
// published again with the same Nats-Msg-Id within its duplicate window, so
// the relay's republish and the replays are mostly absorbed by the broker
// here; the consumers' dedup is still exercised by the redelivery after a
// commit.
func TestChaosEmbedded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, brokerURL, stop, err := embeddedChaos(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	results := runChaos(ctx, chaosOptions{Binary: shopBinary, DB: db, Broker: brokerURL, LogDir: t.TempDir()})
	// Every case but the CDC relay's, which needs PostgreSQL.
	checkChaos(t, results, applicableCases(db))
}

// TestChaosPostgresKafka runs chaosSubset on PostgreSQL + Kafka. Kafka is
// franz-go's in-process kfake cluster, listening on a TCP port so that the
// shop processes can reach it; topics are created on first use.
func TestChaosPostgresKafka(t *testing.T) {
	t.Parallel()
	pg := testdb.PostgresURL(t)
	kafkaURL := startKafka(t)
	results := runChaos(context.Background(), chaosOptions{
		Binary: shopBinary, DB: pg, Broker: kafkaURL + "?session_timeout=6s", Only: chaosSubset, LogDir: t.TempDir(),
	})
	checkChaos(t, results, 3)
}

// TestChaosMariaDBKafka runs the crash table on the stack of the second
// article: MariaDB (one database per service) + Kafka, every case but the
// CDC relay's, which need PostgreSQL. Kafka is kfake listening on a TCP
// port, as in TestChaosPostgresKafka.
func TestChaosMariaDBKafka(t *testing.T) {
	t.Parallel()
	my := testdb.MariaDBURL(t)
	kafkaURL := startKafka(t)
	results := runChaos(context.Background(), chaosOptions{
		Binary: shopBinary, DB: my, Broker: kafkaURL + "?session_timeout=6s", LogDir: t.TempDir(),
	})
	checkChaos(t, results, applicableCases(my))
}

// startKafka starts a kfake cluster of one broker listening on a TCP port,
// so that shop processes can reach it, with topics created on first use,
// stopped when the test ends, and returns its kafka:// URL.
func startKafka(t *testing.T) string {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(2))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return "kafka://" + c.ListenAddrs()[0]
}

func freePort() (int, error) {
	addr, err := freeAddr()
	if err != nil {
		return 0, err
	}
	_, p, _ := strings.Cut(addr, ":")
	n, err := strconv.Atoi(p)
	return n, err
}

// TestEndToEndEmbedded runs the shop as "go run ./cmd/shop" does, with no
// database or broker flags: SQLite files and an embedded NATS JetStream
// server under --data-dir.
func TestEndToEndEmbedded(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cl := &cluster{binary: shopBinary, dataDir: dir, logDir: t.TempDir()}
	in, err := openInspector(context.Background(), "sqlite:"+dir, namespaceDefault)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(in.close)
	banner := endToEnd(t, cl, in)
	for _, want := range []string{filepath.Join(dir, "shop_order.db"), "embedded NATS JetStream", "curl"} {
		if !strings.Contains(banner, want) {
			t.Errorf("the banner does not mention %q:\n%s", want, banner)
		}
	}
}

// TestEndToEnd runs the shop on PostgreSQL + RabbitMQ.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	pg, amqpURL := testdb.PostgresURL(t), testamqp.URL(t)
	ns := "e2e_" + randomSuffix()
	in, err := openInspector(context.Background(), pg, ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dropNamespace(in); in.close() })
	endToEnd(t, &cluster{binary: shopBinary, db: pg, broker: amqpURL, namespace: ns, logDir: t.TempDir()}, in)
}

// TestEndToEndMariaDB runs the shop on MariaDB (one database per service)
// with the embedded NATS JetStream broker.
func TestEndToEndMariaDB(t *testing.T) {
	t.Parallel()
	my := testdb.MariaDBURL(t)
	ns := "e2e_" + randomSuffix()
	in, err := openInspector(context.Background(), my, ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dropNamespace(in); in.close() })
	endToEnd(t, &cluster{binary: shopBinary, db: my, namespace: ns, dataDir: t.TempDir(), logDir: t.TempDir()}, in)
}

// endToEnd starts the shop as one process, places orders over HTTP, waits
// until shipping has prepared them, stops it with SIGTERM, starts it again
// and checks that the state is kept and new orders still flow. It returns
// the first process's output.
func endToEnd(t *testing.T, cl *cluster, in *inspector) string {
	t.Helper()
	t.Cleanup(cl.stopAll)
	ctx := context.Background()
	p, err := cl.start(ctx, procSpec{name: "shop", services: "all"})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 3 {
		id, err := placeOK(ctx, p.http, fmt.Sprintf("c-%d", i), 2)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	for _, id := range ids {
		waitFulfilment(t, p.http, id)
	}
	if err := p.stop(); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, p.tail())
	}
	out := p.stdout.String()
	if !strings.Contains(out, "shop: stopped") {
		t.Fatalf("no graceful stop in the output:\n%s", out)
	}

	p, err = cl.start(ctx, procSpec{name: "shop", services: "all", http: p.http})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		var o struct{ Status, Fulfilment string }
		if err := getJSON(ctx, "http://"+p.http+"/orders/"+id, &o); err != nil {
			t.Fatalf("order %s after restart: %v", id, err)
		}
		if o.Status != "confirmed" || o.Fulfilment == "awaiting preparation" {
			t.Errorf("order %s after restart: %+v", id, o)
		}
	}
	id, err := placeOK(ctx, p.http, "c-after", 1)
	if err != nil {
		t.Fatal(err)
	}
	waitFulfilment(t, p.http, id)
	if obs, ok := in.settle(ctx, settleTimeout, len(ids)+1); !ok {
		t.Fatalf("%s\nwarnings and errors of the restarted shop:\n%s", obs, p.problems())
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
	err = getJSON(ctx, "http://"+addr+"/orders/"+id, &o)
	return err == nil && (o.Fulfilment == "in preparation" || o.Fulfilment == "shipment requested"), o.Fulfilment, err
}

// TestHelp checks that --help documents the flags and their variables.
func TestHelp(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(shopBinary, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"--services", "SHOP_DB_URL", "SHOP_BROKER_URL", "SHOP_HTTP", "SHOP_STOCK_DB_URL", "SHOP_RELAY", "Examples:", "shop load"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("--help does not mention %s", want)
		}
	}
}

var _ = http.StatusOK
