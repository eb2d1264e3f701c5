package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/dashboard"
	"github.com/idem-go/idem/internal/adminhttp"
	"github.com/idem-go/idem/internal/registry"
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
	// Token, when set, is what every request carries (the admin address
	// checked it first): the audit lines name it.
	Token string
}

// shopDashboard returns the dashboard over the shop's databases in dbs
// (order, stock, shipping, billing: the carrier's has no outbox and no
// consumer), mounted under dashboardPath. pub, when it can, re-drives
// parked messages (broker.Redeliverer), sends them to another consumer
// (broker.ConsumerPublisher) and tells queue depths (broker.Inspector).
// The caller starts and stops it.
func shopDashboard(dbs map[string]*store.DB, pub any, log *slog.Logger, o dashboardOptions) (*dashboard.Dashboard, error) {
	rd, _ := pub.(broker.Redeliverer)
	cp, _ := pub.(broker.ConsumerPublisher)
	inspector, _ := pub.(broker.Inspector)
	cfg := dashboard.Config{Redeliverer: rd, ConsumerPublisher: cp, Path: dashboardPath, Logger: log, Gatherer: o.Gatherer,
		SampleInterval: o.Sample, History: o.History, ReadOnly: o.ReadOnly, Token: o.Token}
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

// adminDashboard is the dashboard of a shop process, on its admin address.
type adminDashboard struct {
	d *dashboard.Dashboard
	// pub is the publisher opened for it when the process runs no relay
	// (nil otherwise: it uses the relays').
	pub registry.Publisher
}

// openDashboard builds the dashboard over the process's databases, with
// the metrics of its consumers for the commit-to-handle quantiles, and
// re-drives through the relays' publisher or one of its own. A process
// without a database that has consumers or an outbox (--services carrier)
// has no dashboard.
func (a *app) openDashboard(ctx context.Context) error {
	has := false
	for s := range serviceConsumers {
		has = has || a.dbs[s] != nil
	}
	if !has {
		return nil
	}
	ad := &adminDashboard{}
	var pub any = a.pub
	if a.pub == nil {
		p, err := registry.OpenPrefixed(ctx, a.cfg.Broker, a.cfg.brokerPrefix())
		if err != nil {
			return fmt.Errorf("dashboard: broker %s: %w", broker.RedactURL(a.cfg.Broker), err)
		}
		ad.pub, pub = p, p
	}
	var gatherer prometheus.Gatherer
	if a.metrics != nil {
		gatherer = a.metrics.reg
	}
	// Beyond loopback without a token (--insecure-no-auth), the dashboard
	// shows, and refuses to retry or remove (listenAdmin warns).
	d, err := shopDashboard(a.dbs, pub, a.log, dashboardOptions{Gatherer: gatherer, Token: a.cfg.AdminToken,
		ReadOnly: !adminhttp.IsLoopback(a.cfg.AdminAddr) && a.cfg.AdminToken == ""})
	if err != nil {
		if ad.pub != nil {
			_ = ad.pub.Close()
		}
		return err
	}
	ad.d = d
	a.dash = ad
	return nil
}

// dashboardHandler serves the dashboard under dashboardPath of the admin
// address. The admin mux is made before the databases are opened; the
// dashboard exists before the admin address serves (start).
func (a *app) dashboardHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.dash == nil {
			http.Error(w, "shop admin: no dashboard in this process: it runs no service with a database of consumers or an outbox (--services)", http.StatusNotFound)
			return
		}
		a.dash.d.ServeHTTP(w, r)
	})
}

// startDashboard starts the dashboard's sampling.
func (a *app) startDashboard(ctx context.Context) error {
	if a.dash == nil {
		return nil
	}
	return a.dash.d.Start(ctx)
}

// closeDashboard stops the sampling and closes its publisher.
func (a *app) closeDashboard(ctx context.Context) {
	if a.dash == nil {
		return
	}
	if err := a.dash.d.Stop(ctx); err != nil {
		a.log.Warn("dashboard stop", "error", err)
	}
	if a.dash.pub != nil {
		_ = a.dash.pub.Close()
	}
}
