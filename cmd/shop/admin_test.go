package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testkafka"
	"github.com/idem-go/idem/internal/tools/shopkit"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/shop/billing"
	"github.com/idem-go/idem/shop/shipping"
	"github.com/idem-go/idem/shop/stock"
)

// adminGet fetches a path of the admin address without keeping the
// connection (goleak).
func adminGet(ctx context.Context, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// sample returns the value of the sample of metric whose labels contain
// every one of labels (`consumer="stock"`...), and whether there is one.
func sample(scrape, metric string, labels ...string) (float64, bool) {
	sc := bufio.NewScanner(strings.NewReader(scrape))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, metric)
		if !ok || rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		i := strings.LastIndexByte(rest, ' ')
		lbls, val := rest[:i], rest[i+1:]
		match := true
		for _, l := range labels {
			match = match && strings.Contains(lbls, l)
		}
		if !match {
			continue
		}
		v, err := strconv.ParseFloat(val, 64)
		return v, err == nil
	}
	return 0, false
}

// TestAdminMetrics runs the shop on PostgreSQL + RabbitMQ with
// --admin-addr, places orders and an event every consumer rejects, then
// scrapes /metrics: each consumer's applied deliveries and its delays
// match its processed_event markers, the rejected event shows as parked,
// each relay's published rows match its outbox, nothing waits or is
// paused; /debug/pprof/ answers (SHOP_PPROF).
func TestAdminMetrics(t *testing.T) {
	t.Parallel()
	pg, amqpURL := testdb.PostgresURL(t), testamqp.URL(t)
	ns := "adm_" + shopkit.RandomSuffix()
	in, err := shopkit.OpenInspector(context.Background(), pg, ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.DropNamespace(); in.Close() })
	adminMetrics(t, &shopkit.Cluster{Binary: shopBinary, DB: pg, Broker: amqpURL, Namespace: ns, LogDir: t.TempDir()}, in, ns)
}

// TestAdminMetricsEmbedded is TestAdminMetrics on the embedded defaults:
// SQLite files and NATS JetStream.
func TestAdminMetricsEmbedded(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	in, err := shopkit.OpenInspector(context.Background(), "sqlite:"+dir, namespaceDefault)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(in.Close)
	adminMetrics(t, &shopkit.Cluster{Binary: shopBinary, DataDir: dir, LogDir: t.TempDir()}, in, namespaceDefault)
}

// TestAdminMetricsKafka is TestAdminMetrics on PostgreSQL + Kafka (kfake,
// on a TCP port for the shop process).
func TestAdminMetricsKafka(t *testing.T) {
	t.Parallel()
	pg := testdb.PostgresURL(t)
	kafkaURL := testkafka.Start(t)
	ns := "admk_" + shopkit.RandomSuffix()
	in, err := shopkit.OpenInspector(context.Background(), pg, ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.DropNamespace(); in.Close() })
	adminMetrics(t, &shopkit.Cluster{Binary: shopBinary, DB: pg, Broker: kafkaURL + "?session_timeout=6s",
		Namespace: ns, LogDir: t.TempDir()}, in, ns)
}

func adminMetrics(t *testing.T, cl *shopkit.Cluster, in *shopkit.Inspector, ns string) {
	ctx := context.Background()
	admin, err := shopkit.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	cl.ExtraEnv = append(cl.ExtraEnv, "SHOP_ADMIN_ADDR="+admin, "SHOP_PPROF=true")
	t.Cleanup(cl.StopAll)
	p, err := cl.Start(ctx, shopkit.ProcSpec{Name: "shop", Services: "all"})
	if err != nil {
		t.Fatal(err)
	}
	if out := p.Stdout(); !strings.Contains(out, "http://"+admin+"/metrics") {
		t.Errorf("the banner does not give the admin address:\n%s", out)
	}
	const orders = 3
	for i := range orders {
		id, err := shopkit.PlaceOK(ctx, p.HTTP, fmt.Sprintf("c-%d", i), 2)
		if err != nil {
			t.Fatal(err)
		}
		waitFulfilment(t, p.HTTP, id)
	}
	// An order.placed event without lines, as a faulty producer would
	// write it: every consumer of it parks it (idem.Permanent).
	bad, err := idem.NewEvent("order.order.placed.v1", "order", "bad-1", map[string]string{"orderId": "bad-1"})
	if err != nil {
		t.Fatal(err)
	}
	odb := in.DBs["order"]
	tx, err := odb.SQL.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.NewWriter(odb.Driver).Add(ctx, tx, bad); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	// Until the figures settle: per consumer, applied = its markers, one
	// delay per applied event, parked = its failure store (the rejected
	// event, for its three consumers), no retry, no pause; per relay,
	// published = the outbox's published rows, nothing in flight.
	url := "http://" + admin + "/metrics"
	var scrape string
	var problems []string
	deadline := time.Now().Add(shopkit.SettleTimeout)
	for {
		_, scrape, err = adminGet(ctx, url)
		problems = adminProblems(ctx, t, in, ns, scrape)
		if err != nil {
			problems = append(problems, err.Error())
		}
		if len(problems) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the metrics do not match the databases after %v:\n%s\nlast scrape:\n%s", shopkit.SettleTimeout, strings.Join(problems, "\n"), scrape)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, m := range []string{"go_goroutines", "process_resident_memory_bytes"} {
		if _, ok := sample(scrape, m); !ok {
			t.Errorf("/metrics has no %s", m)
		}
	}

	for path, want := range map[string]string{
		"/debug/pprof/":                  "goroutine",
		"/debug/pprof/goroutine?debug=1": "goroutine profile:",
		"/":                              "/metrics",
	} {
		code, body, err := adminGet(ctx, "http://"+admin+path)
		if err != nil || code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("GET %s: %d %v, want 200 with %q", path, code, err, want)
		}
	}
	if err := p.Stop(); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, p.Tail())
	}
}

// adminProblems compares a scrape of the shop's /metrics with its
// databases, and says what differs.
func adminProblems(ctx context.Context, t *testing.T, in *shopkit.Inspector, ns, scrape string) []string {
	t.Helper()
	var out []string
	count := func(service, query string, args ...any) int64 {
		n, err := in.DBs[service].Count(ctx, query, args...)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	expect := func(metric string, labels []string, want int64) {
		if v, ok := sample(scrape, metric, labels...); !ok || v != float64(want) {
			out = append(out, fmt.Sprintf("%s%v = %v (found %v), want %d", metric, labels, v, ok, want))
		}
	}
	atLeast := func(metric string, labels []string, want int64) {
		if v, ok := sample(scrape, metric, labels...); !ok || v < float64(want) {
			out = append(out, fmt.Sprintf("%s%v = %v (found %v), want at least %d", metric, labels, v, ok, want))
		}
	}
	rejects := map[string]bool{stock.ConsumerName: true, shipping.PreparationConsumer: true, billing.InvoiceConsumer: true}
	for _, c := range []struct{ name, service string }{
		{stock.ConsumerName, "stock"}, {shipping.PreparationConsumer, "shipping"}, {shipping.CarrierConsumer, "shipping"},
		{billing.InvoiceConsumer, "billing"}, {billing.MailerConsumer, "billing"},
	} {
		markers := count(c.service, `SELECT count(*) FROM processed_event WHERE consumer_name = $1`, c.name)
		parked := count(c.service, `SELECT count(*) FROM failed_message WHERE consumer_name = $1`, c.name)
		if want := map[bool]int64{true: 1}[rejects[c.name]]; parked != want {
			out = append(out, fmt.Sprintf("%s: %d parked in the database, want %d", c.name, parked, want))
		}
		lbl := `consumer="` + c.name + `"`
		expect("idem_consumer_deliveries_total", []string{lbl, `outcome="applied"`}, markers)
		expect("idem_consumer_commit_to_handle_seconds_count", []string{lbl}, markers)
		expect("idem_consumer_deliveries_total", []string{lbl, `outcome="parked"`}, parked)
		expect("idem_consumer_parked_messages", []string{lbl}, parked)
		expect("idem_consumer_deliveries_total", []string{lbl, `outcome="retried"`}, 0)
		expect("idem_consumer_retry_backlog", []string{lbl}, 0)
		expect("idem_consumer_paused", []string{lbl}, 0)
		atLeast("idem_consumer_handler_duration_seconds_count", []string{lbl}, markers+parked)
		atLeast("idem_consumer_batch_size_sum", []string{lbl}, markers+parked)
		atLeast("idem_consumer_deliveries_total", []string{lbl, `outcome="applied"`}, 3)
	}
	for _, s := range []string{"order", "shipping", "billing"} {
		published := count(s, `SELECT count(*) FROM outbox WHERE published_at IS NOT NULL`)
		lbl := `table="` + ns + "_" + s + `.outbox"`
		expect("idem_relay_published_total", []string{lbl}, published)
		expect("idem_relay_commit_to_publish_seconds_count", []string{lbl}, published)
		expect("idem_relay_inflight_publishes", []string{lbl}, 0)
		expect("idem_relay_quarantined_rows", []string{lbl}, 0)
		for _, h := range []string{"claim", "publish", "mark"} {
			atLeast("idem_relay_"+h+"_duration_seconds_count", []string{lbl}, 1)
		}
	}
	return out
}
