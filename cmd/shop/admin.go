package main

import (
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/inbox/inboxmetrics"
	"github.com/idem-go/idem/internal/netaddr"
	"github.com/idem-go/idem/internal/pprofhttp"
	"github.com/idem-go/idem/relay"
	"github.com/idem-go/idem/relay/cdc"
	"github.com/idem-go/idem/relay/cdc/cdcmetrics"
	"github.com/idem-go/idem/relay/relaymetrics"
)

// The admin address (--admin-addr) serves what operators and their tools
// read: /metrics (Prometheus: every relay and consumer of the process, the
// Go runtime and the process) and /debug/pprof/ (the Go profiles). It is
// off by default; it belongs on loopback or a private network.

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

// adminMux returns the handlers of the admin address. Mount more under
// paths of their own (the dashboard under /dashboard/).
func (a *app) adminMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(a.metrics.reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(a.log.Handler(), slog.LevelWarn)}))
	pprofhttp.Register(mux)
	mux.Handle(dashboardPath, a.dashboardHandler())
	mux.HandleFunc("/{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, "shop admin: /metrics (Prometheus), /debug/pprof/ (Go profiles), /dashboard/ (status and parked messages)\n")
	})
	return mux
}

// listenAdmin opens the admin address, warning when it is reachable
// beyond this machine.
func (a *app) listenAdmin() error {
	addr := a.cfg.AdminAddr
	if !netaddr.IsLoopback(addr) {
		a.log.Warn("--admin-addr is not a loopback address, and it has no authentication: /metrics, /debug/pprof/ (which shows the program's memory and command line) and /dashboard/ (parked messages, bodies included) are served to anyone who can reach it; the dashboard is read-only there (its retry and remove are refused: run idem dashboard on loopback for them); prefer 127.0.0.1:PORT behind your own access control",
			"admin_addr", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil && a.cfg.AdminDefault && errors.Is(err, syscall.EADDRINUSE) {
		// Another shop (or anything else) has the default port: the
		// banner prints the address taken instead.
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		if err == nil {
			a.log.Info("the default admin address is taken; serving it on another port", "taken", addr, "admin_addr", ln.Addr().String())
		}
	}
	if err != nil {
		return fmt.Errorf("listen on %s (--admin-addr; \"off\" serves none): %w", addr, err)
	}
	a.adminListener = ln
	a.admin = &http.Server{Handler: a.adminMux(), ReadHeaderTimeout: 10 * time.Second}
	return nil
}

// serveAdmin serves the admin address until close.
func (a *app) serveAdmin() {
	if a.admin == nil {
		return
	}
	a.bg.Go(func() {
		if err := a.admin.Serve(a.adminListener); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("admin server stopped", "error", err)
		}
	})
}
