package main

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/dashboard"
	"github.com/idem-go/idem/monitor"
	"github.com/idem-go/idem/shop/billing"
	"github.com/idem-go/idem/shop/order"
	"github.com/idem-go/idem/shop/shipping"
	"github.com/idem-go/idem/shop/stock"
	"github.com/idem-go/idem/shop/store"
)

// dashboardPath is where the admin address serves the dashboard.
const dashboardPath = "/dashboard/"

// serviceConsumers are the consumers of each service's database, shown on
// the dashboard before they have processed anything.
var serviceConsumers = map[string][]string{
	"order":    {order.ConsumerName},
	"stock":    {stock.ConsumerName},
	"shipping": {shipping.PreparationConsumer, shipping.CarrierConsumer},
	"billing":  {billing.InvoiceConsumer, billing.MailerConsumer},
}

// dashboardOptions are the settings of the shop's dashboard.
type dashboardOptions struct {
	// Gatherer, when not nil, gives the commit-to-handle quantiles.
	Gatherer prometheus.Gatherer
	// Sample is the sampling interval, History how far back the charts
	// go (0: the dashboard's defaults).
	Sample, History time.Duration
	// ReadOnly hides and refuses retry and remove.
	ReadOnly bool
}

// shopDashboard returns the dashboard over the shop's databases in dbs
// (order, stock, shipping, billing: the carrier's has no outbox and no
// consumer), mounted under dashboardPath. pub, when it can, re-drives
// parked messages (broker.Redeliverer) and tells queue depths
// (broker.Inspector). The caller starts and stops it.
func shopDashboard(dbs map[string]*store.DB, pub any, log *slog.Logger, o dashboardOptions) (*dashboard.Dashboard, error) {
	rd, _ := pub.(broker.Redeliverer)
	inspector, _ := pub.(broker.Inspector)
	cfg := dashboard.Config{Redeliverer: rd, Path: dashboardPath, Logger: log, Gatherer: o.Gatherer,
		SampleInterval: o.Sample, History: o.History, ReadOnly: o.ReadOnly}
	for _, s := range databases {
		db := dbs[s]
		consumers, ok := serviceConsumers[s]
		if db == nil || !ok {
			continue
		}
		cfg.Databases = append(cfg.Databases, dashboard.Database{Name: s, Store: db.Driver,
			Source: monitor.New(db.Driver, monitor.Options{Name: s, Broker: inspector, Consumers: consumers})})
	}
	return dashboard.New(cfg)
}
