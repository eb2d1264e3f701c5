package inboxmetrics_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver/sqlite"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/inbox/inboxmetrics"
	"github.com/idem-go/idem/migrate"
)

// A consumer's metrics: give the observer to its Config, watch it, register
// the collector. Every transport's subscriber feeds DeliverBatch, which
// feeds the metrics.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "inboxmetrics-example-")
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(filepath.Join(dir, "stock.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	drv := sqlite.New(db)
	if _, err := migrate.New(drv).Up(ctx); err != nil {
		log.Fatal(err)
	}

	metrics := inboxmetrics.New("stock", inboxmetrics.Options{})
	stock, err := inbox.New(drv, inbox.Config{Name: "stock", Observer: metrics.Observer()})
	if err != nil {
		log.Fatal(err)
	}
	metrics.Watch(stock)
	registry := prometheus.NewRegistry()
	registry.MustRegister(metrics)
	// Serve it: http.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))

	stock.Handle("order.order.placed.v1", func(ctx context.Context, tx *sql.Tx, ev idem.Event) error {
		return nil // reserve the lines
	})
	ev, _ := idem.NewEvent("order.order.placed.v1", "order", "42", map[string]string{"order_id": "42"})
	msg, _ := idem.NewMessage(ev)
	d := inbox.Delivery{Message: msg, Source: "stock.events", Attempt: 1}
	stock.DeliverBatch(ctx, []inbox.Delivery{d, d}) // a duplicate in the batch
	stock.DeliverBatch(ctx, []inbox.Delivery{{Message: idem.Message{Body: []byte("{")}, Attempt: 1}})

	err = testutil.GatherAndCompare(registry, strings.NewReader(`
# HELP idem_consumer_deliveries_total Deliveries settled by the consumer, by outcome: applied, duplicate, ignored, retried, paused, deferred, parked.
# TYPE idem_consumer_deliveries_total counter
idem_consumer_deliveries_total{consumer="stock",outcome="applied"} 1
idem_consumer_deliveries_total{consumer="stock",outcome="deferred"} 0
idem_consumer_deliveries_total{consumer="stock",outcome="duplicate"} 1
idem_consumer_deliveries_total{consumer="stock",outcome="ignored"} 0
idem_consumer_deliveries_total{consumer="stock",outcome="parked"} 1
idem_consumer_deliveries_total{consumer="stock",outcome="paused"} 0
idem_consumer_deliveries_total{consumer="stock",outcome="retried"} 0
# HELP idem_consumer_parked_messages Messages of the consumer in the failure store (failed_message): re-drive or remove them with idem failed.
# TYPE idem_consumer_parked_messages gauge
idem_consumer_parked_messages{consumer="stock"} 1
`), "idem_consumer_deliveries_total", "idem_consumer_parked_messages")
	fmt.Println("metrics as expected:", err == nil)
	// Output: metrics as expected: true
}
