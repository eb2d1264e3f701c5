package main

import (
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/inbox/inboxmetrics"
	"github.com/idem-go/idem/internal/adminhttp"
	"github.com/idem-go/idem/relay"
	"github.com/idem-go/idem/relay/cdc"
	"github.com/idem-go/idem/relay/cdc/cdcmetrics"
	"github.com/idem-go/idem/relay/relaymetrics"
	"github.com/idem-go/idem/shop/store"
)

// The admin address (--admin-addr) serves what operators and their tools
// read: /metrics (Prometheus: every relay and consumer of the process, the
// Go runtime and the process), /dashboard/ and, with --pprof,
// /debug/pprof/ (the Go profiles). It listens on loopback by default;
// beyond, adminhttp's policy asks for a token or --insecure-no-auth.

// metrics holds the collectors of the shop's relays and consumers, in one
// registry with the Go and process collectors. A nil *metrics observes
// nothing.
type metrics struct {
	reg *prometheus.Registry

	mu        sync.Mutex
	consumers map[string]*inboxmetrics.Metrics
}

func newMetrics() *metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &metrics{reg: reg, consumers: map[string]*inboxmetrics.Metrics{}}
}

// consumerRefresh is how old the consumers' parked and retry figures may
// be in a scrape.
const consumerRefresh = time.Second

// observer returns the observer of the consumer named name
// (store.Options.Observer), registering its collector.
func (m *metrics) observer(name string) inbox.Observer {
	if m == nil {
		return inbox.Observer{}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	cm, ok := m.consumers[name]
	if !ok {
		cm = inboxmetrics.New(name, inboxmetrics.Options{Refresh: consumerRefresh})
		m.reg.MustRegister(cm)
		m.consumers[name] = cm
	}
	return cm.Observer()
}

// watchConsumer exports c's state and database figures.
func (m *metrics) watchConsumer(c *inbox.Consumer[*sql.Tx]) {
	if m == nil {
		return
	}
	m.mu.Lock()
	cm := m.consumers[c.Name()]
	m.mu.Unlock()
	if cm != nil {
		cm.Watch(c)
	}
}

// watchNotVisible exports how many times the consumers on db met an event
// whose row db did not show yet (store.DB.NotVisible):
// shop_rows_not_visible_total{service}, 0 unless something published an
// event before its transaction was visible.
func (m *metrics) watchNotVisible(db *store.DB) {
	if m == nil {
		return
	}
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name:        "shop_rows_not_visible_total",
		Help:        "Events whose handler did not find the row the event announces in the producer's database (published before its transaction was visible); retried, never parked.",
		ConstLabels: prometheus.Labels{"service": db.Service},
	}, func() float64 { return float64(db.NotVisibleCount()) }))
}

// instrumentRelay returns cfg with the hooks of the metrics of the relay
// of table, and a function to call with the relay once it exists.
func (m *metrics) instrumentRelay(table string, cfg relay.Config) (relay.Config, func(relaymetrics.StatsSource)) {
	if m == nil {
		return cfg, func(relaymetrics.StatsSource) {}
	}
	rm := relaymetrics.NewWith(relaymetrics.Options{Table: table})
	m.reg.MustRegister(rm)
	return rm.Instrument(cfg), rm.Watch
}

// instrumentCDC returns cfg with the hooks of the metrics (idem_cdc_*) of
// the CDC relay of slot, and a function to call with the relay once it
// exists.
func (m *metrics) instrumentCDC(slot string, cfg cdc.Config) (cdc.Config, func(cdcmetrics.StatsSource)) {
	if m == nil {
		return cfg, func(cdcmetrics.StatsSource) {}
	}
	cm := cdcmetrics.New(slot)
	m.reg.MustRegister(cm)
	return cm.Instrument(cfg), cm.Watch
}

// handleAdmin adds the handlers of the admin address. Mount more under
// paths of their own (the dashboard under /dashboard/).
func (a *app) handleAdmin() {
	a.admin.Handle("/metrics", promhttp.HandlerFor(a.metrics.reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(a.log.Handler(), slog.LevelWarn)}))
	a.admin.Handle(dashboardPath, a.dashboardHandler())
	a.admin.HandleHealth(a.healthy)
	index := "shop admin: /metrics (Prometheus), /healthz, /dashboard/ (status and parked messages)"
	if a.cfg.Pprof {
		index += ", /debug/pprof/ (Go profiles)"
	}
	a.admin.Handle("/{$}", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, index)
	}))
}

// healthy is what /healthz answers (adminhttp.Server.HandleHealth): nil
// once every service has started, and while each relay of the process is
// healthy (a polling relay claims from its database, a CDC relay reads its
// slot or waits for it as a standby). A consumer whose database or broker is
// away pauses and recovers by itself: restarting the process would not
// help, so it does not make the shop unhealthy (its metrics show it).
func (a *app) healthy() error {
	if !a.started.Load() {
		return errors.New("starting")
	}
	for _, name := range []string{"order", "shipping", "billing"} {
		r, ok := a.relays[name].(interface{ Healthy() error })
		if !ok {
			continue
		}
		if err := r.Healthy(); err != nil {
			return fmt.Errorf("relay of %s: %w", name, err)
		}
	}
	return nil
}

// listenAdmin opens the admin address (adminhttp.Listen: its policy was
// checked with the flags).
func (a *app) listenAdmin() error {
	cfg := adminhttp.Config{Addr: a.cfg.AdminAddr, AddrFlag: "--admin-addr", Token: a.cfg.AdminToken, NoAuth: a.cfg.NoAuth,
		Pprof: a.cfg.Pprof, Logger: a.log}
	srv, err := adminhttp.Listen(cfg)
	if err != nil && a.cfg.AdminDefault && errors.Is(err, syscall.EADDRINUSE) {
		// Another shop (or anything else) has the default port: the
		// banner prints the address taken instead.
		cfg.Addr = "127.0.0.1:0"
		srv, err = adminhttp.Listen(cfg)
		if err == nil {
			a.log.Info("the default admin address is taken; serving it on another port", "taken", a.cfg.AdminAddr, "admin_addr", srv.Addr().String())
		}
	}
	if err != nil {
		return fmt.Errorf("listen on %s (--admin-addr; \"off\" serves none): %w", a.cfg.AdminAddr, err)
	}
	if !adminhttp.IsLoopback(a.cfg.AdminAddr) && a.cfg.AdminToken == "" {
		a.log.Warn("--admin-addr listens beyond loopback without authentication (--insecure-no-auth): /metrics and /dashboard/ (parked messages, bodies included; read-only there) are served to anyone who can reach it",
			"admin_addr", a.cfg.AdminAddr)
	}
	a.admin = srv
	a.handleAdmin()
	return nil
}

// serveAdmin serves the admin address until close.
func (a *app) serveAdmin() {
	if a.admin != nil {
		a.admin.Start()
	}
}
