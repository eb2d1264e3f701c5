package main

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/adminhttp"
	"github.com/idem-go/idem/internal/fault"
	"github.com/idem-go/idem/internal/registry"
	"github.com/idem-go/idem/relay"
	"github.com/idem-go/idem/relay/cdc"
	"github.com/idem-go/idem/shop"
	"github.com/idem-go/idem/shop/billing"
	"github.com/idem-go/idem/shop/carrier"
	"github.com/idem-go/idem/shop/order"
	"github.com/idem-go/idem/shop/shipping"
	"github.com/idem-go/idem/shop/stock"
	"github.com/idem-go/idem/shop/store"
)

// Services, in start-up order.
var allServices = []string{"carrier", "order", "stock", "shipping", "billing", "relay"}

// databases lists the services that own a database.
var databases = []string{"order", "stock", "shipping", "billing", "carrier"}

// runConfig is the configuration of "shop" (run).
type runConfig struct {
	Services  []string
	DB        string
	ServiceDB map[string]string
	Broker    string
	HTTP      string
	AdminAddr string
	// AdminDefault is true when AdminAddr is the default one, not a
	// choice: a free port replaces it when it is taken.
	AdminDefault bool
	DataDir      string
	Namespace    string
	CarrierURL   string
	Summary      time.Duration
	KeyLock      time.Duration
	// Relay is relayPoll or relayCDC.
	Relay string
	// Outbox is outboxRows or outboxLog.
	Outbox       string
	RelayLease   time.Duration
	RelayWorkers int
	Workers      int
	MaxConns     int

	// AdminToken, when set, is required on every request to AdminAddr.
	AdminToken string
	// NoAuth lets AdminAddr and HTTP listen beyond loopback without
	// authentication (--insecure-no-auth).
	NoAuth bool
	// Pprof serves the Go profiles on AdminAddr.
	Pprof bool
}

func (c runConfig) has(s string) bool { return slices.Contains(c.Services, s) }

// needsDB reports whether the process opens service's database.
func (c runConfig) needsDB(service string) bool {
	switch service {
	case "order", "shipping", "billing":
		return c.has(service) || c.has("relay")
	}
	return c.has(service)
}

// dbURL returns the database URL of a service.
func (c runConfig) dbURL(service string) string {
	if u := c.ServiceDB[service]; u != "" {
		return u
	}
	return c.DB
}

// brokerPrefix is the prefix of broker names: none for the default
// namespace, so that the default topology is the documented one (exchange
// "events", queues "<consumer>.events").
func (c runConfig) brokerPrefix() string {
	if c.Namespace == namespaceDefault {
		return ""
	}
	return c.Namespace
}

const namespaceDefault = "shop"

// adminAddrDefault is the default admin address: metrics, profiles and
// the dashboard of the process, on loopback.
const adminAddrDefault = "127.0.0.1:9464"

// The relays of --relay.
const (
	// relayPoll is the polling relay (package relay), on every dialect.
	relayPoll = "poll"
	// relayCDC is the CDC relay: package relay/cdc on PostgreSQL,
	// relay/binlog on MariaDB.
	relayCDC = "cdc"
)

// The event writers of --outbox.
const (
	// outboxRows writes outbox rows.
	outboxRows = "rows"
	// outboxLog writes WAL messages (outbox.NewLogWriter), for the CDC
	// relay.
	outboxLog = "log"
)

// app is a running shop process.
type app struct {
	cfg  runConfig
	log  *slog.Logger
	dbs  map[string]*store.DB
	subs []registry.Subscriber

	consumers []*inbox.Consumer[*sql.Tx]
	// consumerDB is the database of each consumer's service, in the
	// order of consumers.
	consumerDB []*store.DB
	purgers    []*inbox.Purger[*sql.Tx]
	relays     map[string]store.Relay
	pub        registry.Publisher
	server     *http.Server
	listener   net.Listener
	order      *order.Service
	carrier    *carrier.Server
	bg         sync.WaitGroup
	cancelBg   context.CancelFunc

	// metrics is nil without --admin-addr; admin serves them.
	metrics *metrics
	admin   *adminhttp.Server
	// dash is the dashboard on the admin address (dashboard.go).
	dash *adminDashboard
	// started is set once start has started everything: /healthz
	// answers "ok" from then on (admin.go).
	started atomic.Bool
}

// openApp opens the databases (applying their migrations), the HTTP
// listener, the subscribers and the relays, without starting them. On an
// error, or when ctx ends, it closes what it opened.
func openApp(ctx context.Context, cfg runConfig, log *slog.Logger) (_ *app, err error) {
	a := &app{cfg: cfg, log: log, dbs: map[string]*store.DB{}, relays: map[string]store.Relay{}}
	defer func() {
		if err != nil {
			closeApp(a)
		}
	}()
	if cfg.AdminAddr != "" {
		a.metrics = newMetrics()
		if err := a.listenAdmin(); err != nil {
			return nil, err
		}
	}
	migrations := map[string]store.Migrations{
		"order": order.Migrations(), "stock": stock.Migrations(), "shipping": shipping.Migrations(),
		"billing": billing.Migrations(), "carrier": carrier.Migrations(),
	}
	for _, s := range databases {
		if !cfg.needsDB(s) {
			continue
		}
		db, err := store.Open(ctx, s, cfg.dbURL(s), cfg.Namespace+"_"+s, store.Options{MaxConns: cfg.MaxConns, Observer: a.metrics.observer, OutboxLog: cfg.Outbox == outboxLog})
		if err != nil {
			return nil, err
		}
		a.dbs[s] = db
		a.metrics.watchNotVisible(db)
		if err := db.Migrate(ctx, migrations[s], log); err != nil {
			return nil, err
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}

	carrierURL := cfg.CarrierURL
	if carrierURL == "" {
		carrierURL = "http://" + cfg.HTTP + "/carrier"
	}
	client := &carrier.Client{BaseURL: strings.TrimSuffix(carrierURL, "/"), Logger: log}
	mux := http.NewServeMux()
	if cfg.has("carrier") {
		a.carrier = carrier.NewServer(a.dbs["carrier"], log)
		mux.Handle("/carrier/", a.carrier.Handler())
	}
	if cfg.has("order") {
		a.order, err = order.New(a.dbs["order"], order.Config{KeyLockTimeout: cfg.KeyLock, Logger: log, BeforeCommit: faultHook(fault.OrderBeforeCommit)})
		if err != nil {
			return nil, err
		}
		// At "/": the order API answers every path the carrier's does not
		// take, its unknown paths with problem documents as its errors.
		mux.Handle("/", notifyAfterWrite(a.order.Handler(), a.dbs["order"]))
		a.addConsumers(a.dbs["order"], a.order.Consumer())
	}
	if cfg.has("stock") {
		s, err := stock.New(a.dbs["stock"], log)
		if err != nil {
			return nil, err
		}
		a.addConsumers(a.dbs["stock"], s.Consumer())
	}
	if cfg.has("shipping") {
		s, err := shipping.New(a.dbs["shipping"], client, shipping.Config{Logger: log, BeforeCommit: faultHook(fault.ShippingBeforeCommit)})
		if err != nil {
			return nil, err
		}
		a.addConsumers(a.dbs["shipping"], s.Consumers()...)
	}
	if cfg.has("billing") {
		s, err := billing.New(a.dbs["billing"], client, log)
		if err != nil {
			return nil, err
		}
		a.addConsumers(a.dbs["billing"], s.Consumers()...)
	}
	if cfg.has("order") || cfg.has("carrier") {
		a.listener, err = net.Listen("tcp", cfg.HTTP)
		if err != nil {
			return nil, fmt.Errorf("listen on %s (--http): %w", cfg.HTTP, err)
		}
		a.server = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	}

	// A partitioned broker URL (?partitions=P) has the replicas of each
	// consumer share its partitions through an ownership group; otherwise
	// one replica consumes and the others stand by.
	partitions, err := registry.Partitions(cfg.Broker)
	if err != nil {
		return nil, err
	}
	for i, c := range a.consumers {
		a.metrics.watchConsumer(c)
		sc := registry.SubscribeConfig{
			Consumer: c.Name(), EventNames: c.EventNames(), AggregateTypes: shop.AggregateTypes(c.EventNames()),
			Prefix:  cfg.brokerPrefix(),
			Workers: cfg.Workers, Logger: log,
		}
		deliver := notifyAfterDelivery(c.DeliverBatch, a.consumerDB[i])
		var sub registry.Subscriber
		if partitions > 0 {
			sub, err = inbox.NewGroup(c, inbox.GroupConfig{
				Partitions: partitions,
				Subscriber: func(k int) (broker.Subscriber, error) {
					sc := sc
					sc.Partition = k
					return registry.Subscribe(cfg.Broker, sc, deliver)
				},
			})
		} else {
			sub, err = registry.Subscribe(cfg.Broker, sc, deliver)
		}
		if err != nil {
			return nil, fmt.Errorf("subscribe %s: %w", c.Name(), err)
		}
		a.subs = append(a.subs, sub)
	}
	if cfg.has("relay") {
		a.pub, err = registry.OpenPrefixed(ctx, cfg.Broker, cfg.brokerPrefix())
		if err != nil {
			return nil, fmt.Errorf("broker %s: %w", broker.RedactURL(cfg.Broker), err)
		}
		for _, s := range []string{"order", "shipping", "billing"} {
			if cfg.Relay == relayCDC {
				// With rows (not WAL messages), every event is a row the
				// relay deletes: a failover to a standby loses none.
				ccfg, watch := a.metrics.instrumentCDC(a.dbs[s].CDCSlot(), cdc.Config{Logger: log.With("outbox", s), RowsOnly: cfg.Outbox != outboxLog})
				r, err := a.dbs[s].NewCDCRelay(a.pub, ccfg)
				if err != nil {
					return nil, fmt.Errorf("relay of %s (--relay cdc): %w", s, err)
				}
				watch(r.Log)
				a.relays[s] = r
				continue
			}
			rcfg, watch := a.metrics.instrumentRelay(cfg.Namespace+"_"+s+".outbox", relay.Config{
				Workers: cfg.RelayWorkers, Lease: cfg.RelayLease, Logger: log.With("outbox", s),
				RetryBackoff: 100 * time.Millisecond, MaxRetryBackoff: 5 * time.Second,
				StatsInterval:   relayStatsInterval,
				MaxPollInterval: cfg.relayMaxPoll(s),
			})
			r, err := a.dbs[s].NewRelay(a.pub, rcfg)
			if err != nil {
				return nil, fmt.Errorf("relay of %s: %w", s, err)
			}
			watch(r)
			a.relays[s] = r
		}
	}
	if a.admin != nil {
		if err := a.openDashboard(ctx); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// How rarely an idle relay of the shop polls. A service running in the
// relay's process wakes it when it commits outbox rows (store.DB.Notify,
// through notifyAfterWrite and notifyAfterDelivery), so an idle shop sleeps
// without delaying an order: its relays back off to
// relayMaxPollInProcess. A relay without its service in the process (the
// services split over processes) is told nothing and backs off to
// relayMaxPollAlone only: the first rows after an idle period wait that
// long at most. On PostgreSQL, LISTEN/NOTIFY wakes every relay at once
// anyway.
const (
	relayMaxPollInProcess = 5 * time.Second
	relayMaxPollAlone     = time.Second
)

// relayStatsInterval is how often each relay measures its backlog (the
// summary's outbox_backlog and lag, the idem_relay_backlog gauges): often
// enough for the summary printed every 10 s, rarely enough that an idle
// shop's three relays do not read their outbox more often than they poll.
const relayStatsInterval = 5 * time.Second

// relayMaxPoll is the MaxPollInterval of the relay of service's outbox.
func (c runConfig) relayMaxPoll(service string) time.Duration {
	if c.has(service) {
		return relayMaxPollInProcess
	}
	return relayMaxPollAlone
}

// addConsumers adds consumers of the service whose database is db, with
// their handlers registered.
func (a *app) addConsumers(db *store.DB, cs ...*inbox.Consumer[*sql.Tx]) {
	for _, c := range cs {
		if recordApplications {
			db.RecordApplications(c)
		}
		a.consumers = append(a.consumers, c)
		a.consumerDB = append(a.consumerDB, db)
	}
}

// notifyAfterWrite wakes db's relay after each request to h that inserted
// outbox rows (a retried order with the same Idempotency-Key inserts none).
func notifyAfterWrite(h http.Handler, db *store.DB) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		before := db.OutboxAdds()
		h.ServeHTTP(w, r)
		db.NotifyIfAdded(before)
	})
}

// notifyAfterDelivery wakes db's relay after each batch that deliver
// handled, when its handlers inserted outbox rows.
func notifyAfterDelivery(deliver broker.DeliverFunc, db *store.DB) broker.DeliverFunc {
	return func(ctx context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
		before := db.OutboxAdds()
		disps, errs := deliver(ctx, ds)
		db.NotifyIfAdded(before)
		return disps, errs
	}
}

// start starts everything: HTTP first (the carrier must answer the
// consumers), then the subscribers (they declare the queues the relays
// publish to), then the relays.
func (a *app) start(ctx context.Context) error {
	bgCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	a.cancelBg = cancel
	if err := a.startDashboard(ctx); err != nil {
		return err
	}
	a.serveAdmin()
	if a.server != nil {
		a.bg.Go(func() {
			if err := a.server.Serve(a.listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
				a.log.Error("HTTP server stopped", "error", err)
			}
		})
	}
	if a.order != nil {
		a.bg.Go(func() { a.order.Run(bgCtx) })
	}
	for _, c := range a.consumers {
		// Markers older than the replay window (the relays' retention, 7
		// days) plus a day go, every hour.
		p, err := inbox.NewPurger(c.Driver(), inbox.PurgerConfig{
			Markers: inbox.PurgeConfig{Consumer: c.Name(), Horizon: relay.RetentionDefault + 24*time.Hour, ReplayWindow: relay.RetentionDefault},
			Logger:  a.log,
		})
		if err != nil {
			return err
		}
		if err := p.Start(ctx); err != nil {
			return err
		}
		a.purgers = append(a.purgers, p)
	}
	for _, s := range a.subs {
		if err := s.Start(ctx); err != nil {
			return err
		}
	}
	for _, name := range []string{"order", "shipping", "billing"} {
		if r := a.relays[name]; r != nil {
			if err := r.Start(ctx); err != nil {
				return fmt.Errorf("relay of %s: %w", name, err)
			}
		}
	}
	a.started.Store(true)
	return nil
}

// close stops everything gracefully: HTTP (no new orders), relays,
// subscribers (finish and ack in-flight batches), then the databases.
func (a *app) close(ctx context.Context) {
	if a.server != nil {
		if err := a.server.Shutdown(ctx); err != nil {
			a.log.Warn("HTTP shutdown", "error", err)
		}
	} else if a.listener != nil {
		_ = a.listener.Close()
	}
	if a.admin != nil {
		if err := a.admin.Shutdown(ctx); err != nil {
			a.log.Warn("admin HTTP shutdown", "error", err)
		}
	}
	a.closeDashboard(ctx)
	for name, r := range a.relays {
		if err := r.Stop(ctx); err != nil {
			a.log.Warn("relay stop", "outbox", name, "error", err)
		}
	}
	var wg sync.WaitGroup
	for _, s := range a.subs {
		wg.Go(func() {
			if err := s.Stop(ctx); err != nil {
				a.log.Warn("subscriber stop", "error", err)
			}
		})
	}
	for _, p := range a.purgers {
		wg.Go(func() {
			if err := p.Stop(ctx); err != nil {
				a.log.Warn("purger stop", "error", err)
			}
		})
	}
	wg.Wait()
	if a.pub != nil {
		_ = a.pub.Close()
	}
	if a.cancelBg != nil {
		a.cancelBg()
	}
	a.bg.Wait()
	for _, db := range a.dbs {
		db.Close()
	}
}

// banner describes the running process.
func (a *app) banner(w io.Writer) {
	fmt.Fprintf(w, "shop: services %s\n", strings.Join(a.cfg.Services, ","))
	for _, s := range databases {
		if db := a.dbs[s]; db != nil {
			fmt.Fprintf(w, "shop:   %-8s database %s\n", s, db.Where())
		}
	}
	if dir, ok := embeddedDir(a.cfg.Broker); ok {
		fmt.Fprintf(w, "shop:   broker   embedded NATS JetStream, data in %s\n", dir)
	} else {
		fmt.Fprintf(w, "shop:   broker   %s\n", broker.RedactURL(a.cfg.Broker))
	}
	if len(a.relays) > 0 {
		if a.cfg.Relay == relayCDC {
			if a.dbs["order"].Dialect == store.MySQL {
				fmt.Fprintln(w, "shop:   relays   CDC (MariaDB's binary log), events as outbox rows")
			} else {
				fmt.Fprintf(w, "shop:   relays   CDC (logical replication slots %s...), events as %s\n", a.dbs["order"].CDCSlot(),
					map[string]string{outboxRows: "outbox rows", outboxLog: "WAL messages"}[a.cfg.Outbox])
			}
		} else {
			fmt.Fprintln(w, "shop:   relays   polling")
		}
	}
	if a.server != nil {
		if a.order != nil {
			fmt.Fprintf(w, "shop:   order API http://%s/orders\n", a.cfg.HTTP)
		}
		if a.carrier != nil {
			fmt.Fprintf(w, "shop:   carrier   http://%s/carrier/stats\n", a.cfg.HTTP)
		}
	}
	if a.admin != nil {
		profiles := ""
		if a.cfg.Pprof {
			profiles = fmt.Sprintf("  http://%s/debug/pprof/", a.admin.Addr())
		}
		fmt.Fprintf(w, "shop:   admin     http://%s/metrics%s\n", a.admin.Addr(), profiles)
		if a.dash != nil {
			dash := fmt.Sprintf("http://%s%s", a.admin.Addr(), dashboardPath)
			fmt.Fprintf(w, "shop:   dashboard %s  (open it in a browser)\n", dash)
			fmt.Fprintf(w, "shop:   status    go run ./cmd/idem status --dashboard %s\n", dash)
		}
	} else {
		fmt.Fprintln(w, "shop:   dashboard off (--admin-addr off); start without it to serve it on "+adminAddrDefault)
	}
	if a.order != nil {
		fmt.Fprint(w, orderHowTo(a.cfg.HTTP, uuid.NewString()))
	}
}

// embeddedDir returns the data directory of an embedded NATS broker URL.
func embeddedDir(rawURL string) (string, bool) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Host != "embedded" && rawURL != "embedded" && !strings.HasPrefix(rawURL, "embedded?")) {
		return "", false
	}
	if u.Host == "" {
		u, err = url.Parse("nats://" + rawURL)
		if err != nil {
			return "", false
		}
	}
	return cmp.Or(u.Query().Get("dir"), registry.EmbeddedDirDefault), true
}

// summary is the periodic one-line summary.
func (a *app) summary(ctx context.Context) string {
	var parts []string
	count := func(label, service, query string) {
		if db := a.dbs[service]; db != nil && a.cfg.has(service) {
			n, err := db.Count(ctx, query)
			if err != nil {
				parts = append(parts, label+"=?")
				return
			}
			parts = append(parts, fmt.Sprintf("%s=%d", label, n))
		}
	}
	count("orders", "order", `SELECT count(*) FROM orders`)
	count("reservations", "stock", `SELECT count(*) FROM reservation`)
	count("preparations", "shipping", `SELECT count(*) FROM preparation`)
	count("shipments", "shipping", `SELECT count(*) FROM shipment`)
	count("invoices", "billing", `SELECT count(*) FROM invoice`)
	var dup, failed uint64
	for _, c := range a.consumers {
		st := c.Stats()
		dup += st.Duplicates
		failed += st.Failed + st.Parked
	}
	if len(a.consumers) > 0 {
		parts = append(parts, fmt.Sprintf("duplicates_skipped=%d failed=%d", dup, failed))
	}
	if len(a.relays) > 0 {
		var backlog, quarantined int64
		var oldest time.Time
		for _, r := range a.relays {
			st := r.Stats()
			backlog += st.Backlog
			quarantined += st.QuarantinedRows
			if !st.OldestUnpublished.IsZero() && (oldest.IsZero() || st.OldestUnpublished.Before(oldest)) {
				oldest = st.OldestUnpublished
			}
		}
		lag := time.Duration(0)
		if !oldest.IsZero() {
			lag = time.Since(oldest).Round(time.Millisecond)
		}
		parts = append(parts, fmt.Sprintf("outbox_backlog=%d lag=%s outbox_quarantined=%d", backlog, lag, quarantined))
	}
	return "shop: " + strings.Join(parts, " ")
}

// orderHowTo tells how to place an order on the API at addr, with a
// ready-to-paste command that carries a fresh Idempotency-Key.
func orderHowTo(addr, key string) string {
	return fmt.Sprintf(`shop: place an order (sent again with the same key, it answers with the same order):
  curl -si -X POST http://%[1]s/orders -H 'Content-Type: application/json' -H 'Idempotency-Key: %[2]s' \
    -d '{"customer_id":"c-7","lines":[{"product_id":"p-1","quantity":"2.000"}]}'
shop: a new order needs a new key, e.g. -H "Idempotency-Key: $(cat /proc/sys/kernel/random/uuid)"
shop: follow it: curl -s http://%[1]s/orders/<id>
`, addr, key)
}
