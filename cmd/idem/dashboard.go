package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/dashboard"
	"github.com/idem-go/idem/internal/adminhttp"
	"github.com/idem-go/idem/internal/envflag"
	"github.com/idem-go/idem/internal/registry"
	"github.com/idem-go/idem/monitor"
	"github.com/idem-go/idem/outbox"
)

// dbList is a repeatable --db flag: [NAME=]URL.
type dbList []string

func (l *dbList) String() string     { return strings.Join(*l, " ") }
func (l *dbList) Set(v string) error { *l = append(*l, v); return nil }

// dashboardCommand is "idem dashboard".
func dashboardCommand() *command {
	return &command{
		name:    "dashboard",
		summary: "serve the web dashboard: status, charts of the last hour, parked messages to retry or remove",
		usage: `Usage:
  idem dashboard --db [NAME=]URL [--db [NAME=]URL ...] [--broker URL] [--http 127.0.0.1:8090]
                 [--read-only] [--auth-token-file FILE | --basic-auth-file FILE] [--sample 10s] [--metrics URL ...]

Serves a web dashboard over one or more databases (a service's database
each: its outbox, its consumers' markers and failure store):

  /            per database: outbox backlog, age of the oldest unpublished
               row, last publish, quarantined rows; per consumer: last
               processed, processed in the last minute, parked messages,
               oldest parked, and what waits in the broker when it can tell;
               charts of the last hour (--history), sampled every --sample
  /messages    the parked messages, with filters (database, consumer, event,
               source, since, held by)
  /messages/DB/ID   one message: body (text, or a hex dump), headers, error
               history, attempts, aggregate; retry or remove it
  /status.json the figures of the overview, for scripts

Retry publishes the message again, unchanged, to the queue it came from, as
"idem failed retry" does (with the messages held behind it); it needs
--broker, and without one the page says so. Remove deletes it. Each action
asks for confirmation, is a POST carrying a CSRF token, is refused from
another site, and is logged on stderr (who, from where, what, which message,
the result). --read-only hides and refuses them.

Name each database with NAME= (default: the schema, else the URL's database
name or the SQLite file name). --schema lists the PostgreSQL schemas (MySQL
databases) holding idem's tables, one dashboard database each, as
"idem status --schema" does; ?search_path=SCHEMA in a PostgreSQL URL works
too. Pages work
without --broker: the figures then come from the databases only. With
--metrics pointing at the consumers' Prometheus endpoints, the overview adds
each consumer's commit-to-handle p50 and p99
(idem_consumer_commit_to_handle_seconds).

The dashboard listens on loopback by default. Anything else needs a token
(--auth-token-file FILE, or IDEM_DASHBOARD_TOKEN; sent as "Authorization:
Bearer TOKEN", or as the password of the browser's login prompt) or basic
authentication (--basic-auth-file FILE holding USER:PASS, or
IDEM_DASHBOARD_BASIC_AUTH), or --insecure-no-auth to say that a proxy in
front authenticates. Neither a token nor a password goes on the command
line, where every user of the machine can read it; nor do URLs with
passwords: give them in IDEM_DB_URL and IDEM_BROKER_URL or in files
(--db-file, repeatable, and --broker-file). Stop it with Ctrl-C or SIGTERM.

Examples:
  idem dashboard --db postgres://app@localhost/shop
  IDEM_BROKER_URL=amqp://... idem dashboard --db postgres://localhost/shop \
                 --schema shop_order,shop_stock,shop_shipping,shop_billing --metrics http://127.0.0.1:9464/metrics
  idem dashboard --db-file /run/secrets/orders-db-url --db-file /run/secrets/stock-db-url   # each file: NAME=URL
  idem dashboard --http :8090 --auth-token-file /run/secrets/dashboard-token --read-only`,
		setup: setupDashboard,
	}
}

// dashboardOptions holds the flags of "idem dashboard".
type dashboardOptions struct {
	dbs           dbList
	schemas       listFlag
	brokerURL     string
	prefix        string
	addr          string
	path          string
	readOnly      bool
	failureEvents bool
	admin         adminhttp.Flags
	basicFile     string
	metricsURLs   dbList
	sample        time.Duration
	history       time.Duration
	logFormat     string
	logLevel      string
}

// The variables of the dashboard's credentials.
const (
	dashboardTokenEnv = "IDEM_DASHBOARD_TOKEN"
	dashboardBasicEnv = "IDEM_DASHBOARD_BASIC_AUTH"
)

// setupDashboard declares the flags of "idem dashboard" on fs and returns the
// function that runs the command.
func setupDashboard(fs *flag.FlagSet) runFunc {
	o := &dashboardOptions{}
	fs.Var(&o.dbs, "db", "[NAME=]database URL, repeatable (default $IDEM_DB_URL):\n"+registry.DatabaseURLHelp())
	envflag.FileFlag(fs, "db")
	fs.Var(&o.schemas, "schema", "schemas (PostgreSQL) or databases (MySQL) holding idem's tables, comma-separated or repeated: one dashboard database per schema of each --db (default $IDEM_SCHEMA, else the connection's)")
	fs.StringVar(&o.brokerURL, "broker", "", "broker URL, to retry messages and read queue depths (default $IDEM_BROKER_URL; none: database figures only, no retry):\n"+registry.BrokerURLHelp())
	envflag.FileFlag(fs, "broker")
	fs.StringVar(&o.prefix, "prefix", "", "prefix of the broker's names, as the consumers subscribed with (queues <prefix>.<consumer>.events, groups <prefix>.<consumer>)")
	fs.StringVar(&o.addr, "http", "127.0.0.1:8090", "address to listen on")
	fs.StringVar(&o.path, "path", "/", "URL path the pages are served under (behind a proxy that keeps the prefix)")
	fs.BoolVar(&o.readOnly, "read-only", false, "show everything, change no message (no retry, edit, send, archive or remove)")
	fs.BoolVar(&o.failureEvents, "failure-events", false, "write a notice of each message removed, archived or sent to another consumer into its database's outbox (idem.failure.message.resolved.v1)")
	o.admin.Register(fs, "--http", dashboardTokenEnv, false)
	fs.StringVar(&o.basicFile, "basic-auth-file", "", "file holding USER:PASS: require HTTP basic authentication with them on every request (default: $"+dashboardBasicEnv+")")
	fs.Var(&o.metricsURLs, "metrics", "URL of a Prometheus endpoint of the consumers (their /metrics), repeatable: the overview and charts show each consumer's commit-to-handle p50 and p99")
	fs.DurationVar(&o.sample, "sample", dashboard.SampleIntervalDefault, "how often the databases are sampled for the charts (and the overview reloads)")
	fs.DurationVar(&o.history, "history", dashboard.HistoryDefault, "how far back the charts go (kept in memory)")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	return o.run
}

// run runs "idem dashboard" with the positional arguments args.
func (o *dashboardOptions) run(ctx context.Context, e *env, args []string) error {
	if len(args) != 0 {
		return usagef("unexpected arguments %q", args)
	}
	log, err := newLogger(e, o.logFormat, o.logLevel)
	if err != nil {
		return err
	}
	if len(o.dbs) == 0 {
		if u := e.getenv("IDEM_DB_URL"); u != "" {
			o.dbs = dbList{u}
		} else {
			return usagef("no database: pass --db URL (or set IDEM_DB_URL)")
		}
	}
	token, err := o.admin.Token(e.getenv)
	if err != nil {
		return usagef("%v", err)
	}
	basic := e.getenv(dashboardBasicEnv)
	if o.basicFile != "" {
		if basic, err = envflag.ReadFile(o.basicFile); err != nil {
			return usagef("--basic-auth-file: %v", err)
		}
	}
	var auth *dashboard.BasicAuth
	if basic != "" {
		u, p, ok := strings.Cut(basic, ":")
		if !ok || u == "" || p == "" {
			return usagef("--basic-auth-file (or $%s): want USER:PASS", dashboardBasicEnv)
		}
		auth = &dashboard.BasicAuth{User: u, Password: p}
	}
	if err := adminhttp.Check("--http", o.addr, token != "" || auth != nil, o.admin.NoAuth, o.admin.HowToAuth()+", or --basic-auth-file FILE"); err != nil {
		return usagef("%v", err)
	}
	if len(o.schemas) == 0 {
		_ = o.schemas.Set(e.getenv("IDEM_SCHEMA"))
	}
	if len(o.schemas) == 0 {
		o.schemas = listFlag{""}
	}
	if o.brokerURL == "" {
		o.brokerURL = e.getenv("IDEM_BROKER_URL")
	}

	if u, err := url.Parse(o.brokerURL); err == nil && (u.Host == "embedded" || strings.HasPrefix(o.brokerURL, "embedded")) {
		// A second embedded server would open the files of the
		// process that owns them.
		return usagef("--broker %s: an embedded NATS server is only reachable from its own process; start it with ?listen=127.0.0.1:4222 and give nats://127.0.0.1:4222 (the shop serves its own dashboard: shop --admin-addr)", broker.RedactURL(o.brokerURL))
	}
	var rd broker.Redeliverer
	var cp broker.ConsumerPublisher
	var inspector broker.Inspector
	if o.brokerURL != "" && !o.readOnly {
		// A publisher re-drives; it also tells queue depths.
		pub, err := registry.OpenPrefixed(ctx, o.brokerURL, o.prefix)
		if err != nil {
			return err
		}
		defer pub.Close()
		rd, _ = pub.(broker.Redeliverer)
		cp, _ = pub.(broker.ConsumerPublisher)
		inspector, _ = pub.(broker.Inspector)
		if rd == nil {
			log.Warn("this broker cannot send a message back to one queue: retry is disabled", "broker", broker.RedactURL(o.brokerURL))
		}
	}
	if o.brokerURL != "" && inspector == nil {
		// Read-only: an inspector declares nothing in the broker.
		ins, err := registry.OpenInspector(ctx, o.brokerURL, o.prefix)
		if err != nil && o.readOnly {
			return err
		}
		if err == nil {
			defer ins.Close()
			inspector = ins
		}
	}
	cfg := dashboard.Config{Redeliverer: rd, ConsumerPublisher: cp, ReadOnly: o.readOnly, Token: token, BasicAuth: auth, Path: o.path,
		Logger: log, SampleInterval: o.sample, History: o.history}
	if len(o.metricsURLs) > 0 {
		cfg.Gatherer = dashboard.Scrape(nil, o.metricsURLs...)
	}
	for _, spec := range o.dbs {
		given, rawURL := splitNamedURL(spec)
		for _, schema := range o.schemas {
			conn, err := registry.OpenDatabase(ctx, rawURL, registry.DatabaseOptions{Tables: idemmsg.Tables{Schema: schema}, MaxConns: 4})
			if err != nil {
				return err
			}
			defer conn.Close()
			name := given
			switch {
			case name == "" && schema != "":
				name = schema
			case name == "":
				name = databaseName(conn)
			case len(o.schemas) > 1:
				name += "." + schema
			}
			for _, db := range cfg.Databases {
				if db.Name == name {
					return usagef("two databases are named %q: name them with --db NAME=URL", name)
				}
			}
			db := dashboard.Database{Name: name, Store: conn.SQL, Source: monitor.New(conn.SQL, monitor.Options{Name: name, Broker: inspector})}
			if o.failureEvents {
				db.FailureHook = outbox.FailureEvents(outbox.NewWriter(conn.SQL), outbox.FailureEventsConfig{})
			}
			cfg.Databases = append(cfg.Databases, db)
		}
	}
	d, err := dashboard.New(cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("--http: %w", err)
	}
	if err := d.Start(ctx); err != nil {
		_ = ln.Close()
		return err
	}
	mux := http.NewServeMux()
	mux.Handle(cfg.WithDefaults().Path, d)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	where := "http://" + ln.Addr().String() + cfg.WithDefaults().Path
	fmt.Fprintf(e.stdout, "idem dashboard: serving %s (%d database(s)%s%s)\n", where, len(cfg.Databases),
		map[bool]string{true: ", read-only"}[o.readOnly], map[bool]string{true: ", no broker: no retry"}[rd == nil && !o.readOnly])
	log.Info("dashboard serving", "url", where, "databases", len(cfg.Databases), "read_only", o.readOnly,
		"auth", token != "" || auth != nil, "broker", broker.RedactURL(o.brokerURL))
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-served:
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(stopCtx)
	_ = d.Stop(stopCtx)
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return serveErr
	}
	log.Info("dashboard stopped")
	return nil
}

// splitNamedURL splits "NAME=URL" into its name and URL; a spec whose part
// before "=" is not a plain name is a URL alone.
func splitNamedURL(spec string) (name, rawURL string) {
	n, u, ok := strings.Cut(spec, "=")
	if !ok || n == "" || strings.ContainsAny(n, ":/?&@") {
		return "", spec
	}
	return n, u
}

// databaseName names a database after its URL: the SQLite file, or the
// database (and search_path schema) of the URL.
func databaseName(db *registry.Database) string {
	if db.File != "" {
		base := db.File[strings.LastIndex(db.File, "/")+1:]
		return strings.TrimSuffix(base, ".db")
	}
	u, err := url.Parse(db.URL)
	if err != nil {
		return db.Dialect
	}
	name := strings.TrimPrefix(u.Path, "/")
	if sp := u.Query().Get("search_path"); sp != "" {
		name += "." + sp
	}
	if name == "" {
		return u.Host
	}
	return name
}
