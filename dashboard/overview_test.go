package dashboard_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/dashboard"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/monitor"
	"github.com/idem-go/idem/outbox"
)

// figure returns the text of the overview's cell data-figure=name in the
// row (or section) that follows anchor.
func figure(t *testing.T, page, anchor, name string) string {
	t.Helper()
	i := strings.Index(page, anchor)
	if i < 0 {
		t.Fatalf("no %q in the page:\n%s", anchor, page)
	}
	m := regexp.MustCompile(`data-figure="` + name + `">(?:<a [^>]*>)?([^<]*)<`).FindStringSubmatch(page[i:])
	if m == nil {
		t.Fatalf("no figure %q after %q:\n%s", name, anchor, page[i:])
	}
	return strings.TrimSpace(m[1])
}

func TestOverviewFigures(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()

	code, page := b.get(t, "/dashboard/")
	if code != http.StatusOK {
		t.Fatalf("overview: %d\n%s", code, page)
	}
	if got := figure(t, page, `id="db-stock"`, "backlog"); got != "0" {
		t.Errorf("backlog %q, want 0", got)
	}
	if got := figure(t, page, `data-consumer="stock"`, "processed"); got != "0" {
		t.Errorf("processed %q, want 0", got)
	}

	// Three events in the outbox, two processed by the consumer, one parked.
	w := outbox.NewWriter(b.pg.Driver)
	for i := range 3 {
		ev, _ := idem.NewEvent("order.order.placed.v1", "order", fmt.Sprint(i), map[string]string{"order_id": fmt.Sprint(i)})
		if err := pgx.BeginFunc(ctx, b.pg.Pool, func(tx pgx.Tx) error { return w.Add(ctx, tx, ev) }); err != nil {
			t.Fatal(err)
		}
	}
	c, err := inbox.New(b.pg.Driver, inbox.Config{Name: "stock"})
	if err != nil {
		t.Fatal(err)
	}
	c.Handle("order.order.placed.v1", func(context.Context, pgx.Tx, idem.Event) error { return nil })
	for i := range 2 {
		ev, _ := idem.NewEvent("order.order.placed.v1", "order", fmt.Sprint(i), map[string]string{})
		if _, err := c.Process(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	b.park(t, idem.FailedMessage{Source: "stock.events", EventID: uuid.New(), Body: []byte("{}")})
	if strings.Contains(page, `data-figure="scheduled"`) {
		t.Error("a scheduled figure without delayed events")
	}
	// A delayed event: scheduled, apart from the backlog.
	reminder, _ := idem.NewEvent("order.order.reminded.v1", "order", "0", map[string]string{})
	reminder.NotBefore = time.Now().Add(time.Hour)
	if err := pgx.BeginFunc(ctx, b.pg.Pool, func(tx pgx.Tx) error { return w.Add(ctx, tx, reminder) }); err != nil {
		t.Fatal(err)
	}

	_, page = b.get(t, "/dashboard/")
	if got, want := figure(t, page, `id="db-stock"`, "scheduled"), "1, next due "+reminder.NotBefore.UTC().Format("2006-01-02 15:04:05Z"); got != want {
		t.Errorf("scheduled %q, want %q", got, want)
	}
	for name, want := range map[string]string{"backlog": "3", "quarantined": "0"} {
		if got := figure(t, page, `id="db-stock"`, name); got != want {
			t.Errorf("%s %q, want %s", name, got, want)
		}
	}
	if got := figure(t, page, `data-consumer="stock"`, "processed"); got != "2" {
		t.Errorf("processed %q, want 2", got)
	}
	if got := figure(t, page, `data-consumer="stock"`, "parked"); got != "1" {
		t.Errorf("parked %q, want 1", got)
	}
	if !strings.Contains(page, `/dashboard/messages?db=stock&amp;consumer=stock`) {
		t.Error("the parked count does not link to the consumer's messages")
	}
	if !strings.Contains(page, `http-equiv="refresh"`) {
		t.Error("the overview does not refresh itself")
	}

	code, js := b.get(t, "/dashboard/status.json")
	if code != http.StatusOK || !strings.Contains(js, `"Backlog": 3`) || !strings.Contains(js, `"Name": "stock"`) {
		t.Errorf("status.json: %d\n%s", code, js)
	}
}

func TestOverviewMissingTables(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.pg.Exec(t, "DROP TABLE processed_event CASCADE")
	code, page := b.get(t, "/dashboard/")
	if code != http.StatusOK || !strings.Contains(page, "idem migrate up") {
		t.Errorf("overview without the tables: %d, want the page to say to run idem migrate up:\n%s", code, page)
	}
}

// TestChartsFromSamples starts the sampler and checks that the charts fill
// as samples come, with the commit-to-handle quantiles from the gatherer,
// and that Stop ends the sampling goroutine (goleak in TestMain).
func TestChartsFromSamples(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	hist := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "idem_consumer_commit_to_handle_seconds",
		Buckets: []float64{.01, .1, 1, 10}}, []string{"consumer"})
	reg.MustRegister(hist)
	b := setup(t, func(c *dashboard.Config) {
		c.Gatherer = reg
		c.SampleInterval = 50 * time.Millisecond
		c.History = time.Minute
	})
	ctx := testsvc.Ctx(t, time.Minute)
	if err := b.d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// Observations after the first sample: 90 fast, 10 slow.
	testsvc.WaitFor(t, 10*time.Second, "a first sample", func() bool {
		_, page := b.get(t, "/dashboard/")
		return !strings.Contains(page, "no samples yet")
	})
	for range 90 {
		hist.WithLabelValues("stock").Observe(0.005)
	}
	for range 10 {
		hist.WithLabelValues("stock").Observe(5)
	}
	// stock has processed nothing, so it is listed only when named.
	var page string
	testsvc.WaitFor(t, 10*time.Second, "p50 and p99 on the overview", func() bool {
		_, page = b.get(t, "/dashboard/")
		return strings.Contains(page, "5.6ms / 9.1s")
	})
	for _, want := range []string{"Outbox backlog", "Processed per minute", "Parked messages", "Commit to handle", "<polyline"} {
		if !strings.Contains(page, want) {
			t.Errorf("the overview lacks %q", want)
		}
	}
	if err := b.d.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := b.d.Stop(context.Background()); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if code, _ := b.get(t, "/dashboard/"); code != http.StatusOK {
		t.Errorf("overview after Stop: %d", code)
	}
}

// TestScrape reads histograms from Prometheus endpoints, as "idem dashboard
// --metrics" does, merging what several processes expose.
func TestScrape(t *testing.T) {
	t.Parallel()
	var urls []string
	for i, consumer := range []string{"stock", "stock", "billing"} {
		reg := prometheus.NewRegistry()
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "idem_consumer_commit_to_handle_seconds",
			Buckets: []float64{.01, .1, 1}}, []string{"consumer"})
		reg.MustRegister(h)
		for range i + 1 {
			h.WithLabelValues(consumer).Observe(0.05)
		}
		srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	families, err := dashboard.Scrape(&http.Client{Transport: tr, Timeout: 10 * time.Second}, append(urls, "http://127.0.0.1:1/metrics")...).Gather()
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("the unreachable endpoint's error is missing: %v", err)
	}
	counts := map[string]uint64{}
	for _, f := range families {
		if f.GetName() != "idem_consumer_commit_to_handle_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			counts[m.GetLabel()[0].GetValue()] += m.GetHistogram().GetSampleCount()
		}
	}
	if counts["stock"] != 3 || counts["billing"] != 3 {
		t.Errorf("sample counts %v, want stock 3 (1+2 from two processes) and billing 3", counts)
	}
}

// TestOverviewBinlogPosition: on MariaDB, the overview shows the position
// the binlog relay stored for the outbox.
func TestOverviewBinlogPosition(t *testing.T) {
	t.Parallel()
	my := testdb.NewMariaDB(t)
	my.Exec(t, `INSERT INTO binlog_position (outbox_table, gtid_pos) VALUES ('outbox', '0-1-42')`)
	b := setup(t, func(c *dashboard.Config) {
		c.Databases = append(c.Databases, dashboard.Database{Name: "billing", Store: my.Driver,
			Source: monitor.New(my.Driver, monitor.Options{Name: "billing"})})
	})
	_, page := b.get(t, "/dashboard/")
	if got := figure(t, page, `id="db-billing"`, "log-position"); !strings.HasPrefix(got, "0-1-42, ") {
		t.Errorf("binlog position %q, want 0-1-42 and its age", got)
	}
	if strings.Contains(page[:strings.Index(page, `id="db-billing"`)], `data-figure="log-position"`) {
		t.Error("a PostgreSQL database shows a binlog position")
	}
}
