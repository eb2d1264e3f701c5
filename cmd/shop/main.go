// Command shop runs the reference application of idem: an online shop split
// into services (order, stock, shipping, billing, and a fake carrier) that
// exchange events through transactional outboxes, relays and idempotent
// consumers.
//
//	shop [flags]            run services (all by default)
//	shop broker [flags]     run the embedded NATS JetStream server alone
//	shop help [broker]      print the help of the shop or of shop broker
//	shop version            print the shop's version
//
// Run "shop help" or "shop help broker" (or --help after either) for the
// flags. The tools that drive the shop from outside (its crash table, random
// kills and load generator) are internal/tools/shopctl:
// go run ./internal/tools/shopctl help.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/idem-go/idem/internal/adminhttp"
	"github.com/idem-go/idem/internal/envflag"
	"github.com/idem-go/idem/internal/redact"
	"github.com/idem-go/idem/internal/registry"
	"github.com/idem-go/idem/internal/telemetry"
	"github.com/idem-go/idem/internal/version"
)

func main() {
	defer redact.ExitOnPanic("shop")
	args := os.Args[1:]
	var err error
	switch {
	case len(args) > 0 && args[0] == "broker":
		err = brokerMain(args[1:], os.Stdout, os.Stderr)
	case len(args) > 0 && args[0] == "help":
		err = helpMain(args[1:], os.Stdout)
	case len(args) > 0 && args[0] == "version":
		err = versionMain(args[1:], os.Stdout)
	default:
		err = runMain(args, os.Stdout, os.Stderr)
	}
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "shop:", redact.String(err.Error()))
		var ue usageError
		if errors.As(err, &ue) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// usageError is a command line that names no command or help topic.
type usageError string

func (e usageError) Error() string { return string(e) }

// helpMain prints, on stdout, the help of the shop ("shop help") or of its
// command ("shop help broker"): what --help prints.
func helpMain(args []string, stdout io.Writer) error {
	topic := ""
	if len(args) > 0 {
		topic = args[0]
	}
	var err error
	switch {
	case len(args) > 1:
		return usageError(fmt.Sprintf("shop help takes one topic, got %q; run \"shop help\"", strings.Join(args, " ")))
	case topic == "":
		_, _, err = parseRun([]string{"--help"}, stdout)
	case topic == "broker":
		err = brokerMain([]string{"--help"}, stdout, stdout)
	default:
		return usageError(fmt.Sprintf("no help for %q: run \"shop help\" or \"shop help broker\"", topic))
	}
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

// versionMain prints the shop's version ("shop version").
func versionMain(args []string, stdout io.Writer) error {
	if len(args) > 0 {
		return usageError(fmt.Sprintf("shop version takes no argument, got %q; run \"shop help\"", strings.Join(args, " ")))
	}
	_, err := fmt.Fprintln(stdout, version.Line("shop"))
	return err
}

const runHelpHead = `Usage: shop [flags]
       shop broker [flags]
       shop help [broker]
       shop version

Runs the shop's services in this process: the order API, stock, shipping,
billing, the fake carrier and the outbox relays. With no flags, every service
runs on the embedded defaults (SQLite files and an embedded NATS JetStream
server under --data-dir). With --db and --broker, the services run against
real servers; each service keeps its tables in its own PostgreSQL schema
(<namespace>_order, <namespace>_stock...) or MariaDB database, and applies its
migrations at start-up. Stop with Ctrl-C or SIGTERM, at any moment of the
start-up too: in-flight work finishes and the exit status is 0.

The URLs can hold passwords: give them in the variables (SHOP_DB_URL,
SHOP_BROKER_URL...) or in files (--db-file, --broker-file...), not on the
command line, where every user of the machine reads them (ps, /proc). What
the shop prints shows them without their passwords.

Flags (each also read from the environment variable in brackets):
`

var runHelpTail = `
Metrics: curl -s http://127.0.0.1:9464/metrics (the admin address, --admin-addr);
docs/OPERATIONS.md says what each metric means and which alerts to set.

Addresses: --http and --admin-addr listen on loopback by default. Beyond it
(0.0.0.0:9464, :9464), --admin-addr needs a bearer token on every request:
put it in a file and give --auth-token-file FILE (or set SHOP_ADMIN_TOKEN);
Prometheus sends it with authorization: credentials_file, a browser as the
password of its login prompt. The order API and the fake carrier (--http)
have no authentication of their own. --insecure-no-auth lets either listen
beyond loopback without one, when something in front authenticates (the
dashboard is then read-only). --pprof serves the Go profiles on the admin
address (/debug/pprof/; never the command line).

Services: order (HTTP API + consumer "order"), stock (consumer "stock"),
shipping (consumers "shipping-preparation-v1", "shipping-carrier-v1"),
billing (consumers "billing", "billing-mailer"), carrier (fake carrier and
mail HTTP service under /carrier/), relay (relays of the order, shipping and
billing outboxes).

Examples:
  shop
  SHOP_BROKER_URL=amqp://... shop --db postgres://postgres@localhost:5432/shop
  shop --services stock,relay --db postgres://localhost/shop --broker amqp://localhost/
  shop --relay cdc --db postgres://localhost/shop --broker amqp://localhost/
  shop --relay cdc --outbox log --db postgres://localhost/shop --broker amqp://localhost/
  shop --db-file /run/secrets/shop-db-url --broker kafka://localhost:9092    # the file holds the mysql:// URL and its password
  shop --services order,carrier --order-db postgres://localhost/orders --broker nats://localhost:4222
  shop --admin-addr :9464 --auth-token-file /run/secrets/admin-token --pprof

Load and crash tests (from a clone of the repository; go run ./internal/tools/shopctl help):
  go run ./internal/tools/shopctl load --orders 10000 --concurrency 64 --retry-rate 0.05
  go run ./internal/tools/shopctl chaos --db postgres://localhost/shop --broker amqp://localhost/

Order API:
  POST /orders             {"customer_id":"c-7","lines":[{"product_id":"p-1","quantity":"2.000"}]}
                           201 with the order and Location: /orders/{id};
                           header Idempotency-Key: same key + same body replays the response,
                           another body is 422, a retry while the first runs waits
                           for its response (409 after 5 s);
                           keys are kept 24 hours; the body must be sent with
                           Content-Type: application/json (415 otherwise).
  POST /orders/{id}/cancel always accepted: stock, shipping (and the carrier's
                           pickup) and billing compensate; the fulfilment
                           ends "cancelled" or "shipment cancelled".
  GET  /orders/{id}
  Errors are application/problem+json: a 400 names the member to fix (each
  member once, quantities as strings), an unknown path is 404, another
  method on a known path 405 with Allow.

Each order request runs in a trace span (a traceparent header makes it a
child of the caller's), and its events carry the trace through the relay to
every consumer; the spans are exported when tracing is configured.

` + fmt.Sprintf(telemetry.Help, "shop") + "\n"

var runEnv = map[string]string{
	"services": "SHOP_SERVICES", "db": "SHOP_DB_URL", "broker": "SHOP_BROKER_URL", "http": "SHOP_HTTP", "admin-addr": "SHOP_ADMIN_ADDR",
	"data-dir": "SHOP_DATA_DIR", "namespace": "SHOP_NAMESPACE", "carrier-url": "SHOP_CARRIER_URL",
	"summary": "SHOP_SUMMARY_INTERVAL", "key-lock-timeout": "SHOP_KEY_LOCK_TIMEOUT",
	"relay": "SHOP_RELAY", "outbox": "SHOP_OUTBOX", "relay-lease": "SHOP_RELAY_LEASE", "relay-workers": "SHOP_RELAY_WORKERS", "workers": "SHOP_WORKERS",
	"max-conns": "SHOP_MAX_CONNS", "log-level": "SHOP_LOG_LEVEL",
	"auth-token-file": "SHOP_ADMIN_TOKEN_FILE", "insecure-no-auth": "SHOP_INSECURE_NO_AUTH", "pprof": "SHOP_PPROF",
	"order-db": "SHOP_ORDER_DB_URL", "stock-db": "SHOP_STOCK_DB_URL", "shipping-db": "SHOP_SHIPPING_DB_URL",
	"billing-db": "SHOP_BILLING_DB_URL", "carrier-db": "SHOP_CARRIER_DB_URL",
}

// adminTokenEnv holds the admin address's token when no file is given.
const adminTokenEnv = "SHOP_ADMIN_TOKEN"

func parseRun(args []string, stderr io.Writer) (runConfig, string, error) {
	fs := flag.NewFlagSet("shop", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg runConfig
	services := fs.String("services", "all", "comma-separated services to run: order, stock, shipping, billing, carrier, relay, or all")
	fs.StringVar(&cfg.DB, "db", "", "database URL for every service (default: SQLite files under --data-dir); each service's tables in a schema, database or file of its own:\n"+registry.DatabaseURLHelp())
	fs.StringVar(&cfg.Broker, "broker", "", "broker URL (default: embedded NATS JetStream under --data-dir):\n"+registry.BrokerURLHelp())
	envflag.FileFlag(fs, "db")
	envflag.FileFlag(fs, "broker")
	fs.StringVar(&cfg.HTTP, "http", "127.0.0.1:8080", "address of the order API and the fake carrier")
	fs.StringVar(&cfg.AdminAddr, "admin-addr", adminAddrDefault, "admin address, \"off\" to serve none (with the default, a free port when "+adminAddrDefault+"\nis taken; beyond loopback it needs --auth-token-file or --insecure-no-auth): /metrics\n(Prometheus: idem_relay_* and idem_consumer_* of every relay and consumer of the process,\nGo and process metrics), /healthz (200 \"ok\" once started and while its relays are\nhealthy, 503 \"not ok\" otherwise; open without the token), /dashboard/ (status, charts,\nparked messages to retry or remove: docs/OPERATIONS.md) and, with --pprof,\n/debug/pprof/ (Go profiles); idem status --dashboard http://ADDR/dashboard/ prints\nthe status")
	var admin adminhttp.Flags
	admin.Register(fs, "--admin-addr", adminTokenEnv, true)
	fs.Lookup("insecure-no-auth").Usage = "let --admin-addr and --http listen beyond loopback without authentication (something in\nfront of them authenticates; the dashboard is then read-only)"
	fs.StringVar(&cfg.DataDir, "data-dir", defaultDataDir(), "directory of the embedded defaults' data")
	fs.StringVar(&cfg.Namespace, "namespace", namespaceDefault, "prefix of the services' schemas (<namespace>_order...) and, when not \"shop\", of the broker's exchange and queues, so several shops can share servers")
	fs.StringVar(&cfg.CarrierURL, "carrier-url", "", "carrier base URL for shipping and billing (default: http://<--http>/carrier)")
	fs.DurationVar(&cfg.Summary, "summary", 10*time.Second, "interval of the one-line summary; 0 turns it off")
	fs.DurationVar(&cfg.KeyLock, "key-lock-timeout", 10*time.Second, "how long a running order request holds its Idempotency-Key; a retry after it takes over a crashed request's key")
	fs.StringVar(&cfg.Relay, "relay", relayPoll, "how the relays read the outboxes: \"poll\" (claim rows, every database) or \"cdc\"\n(PostgreSQL: read each outbox's inserts from the write-ahead log through a logical\nreplication slot idem_<namespace>_<service>_outbox; the server needs wal_level=logical,\nand a retired namespace's slots must be dropped: idem cdc drop-slot. MariaDB: read them\nfrom the binary log; the server needs log_bin and binlog_format=ROW (MariaDB's other\ndefaults work): see idem help cdc)")
	fs.StringVar(&cfg.Outbox, "outbox", outboxRows, "how the services write their events: \"rows\" (the outbox table) or \"log\" (PostgreSQL\nwith --relay cdc: WAL messages in the business transaction, pg_logical_emit_message: no row,\nno index, no vacuum)")
	fs.DurationVar(&cfg.RelayLease, "relay-lease", 30*time.Second, "relay lease: a crashed relay's claimed rows are published again after it")
	fs.IntVar(&cfg.RelayWorkers, "relay-workers", 2, "relay workers per outbox")
	fs.IntVar(&cfg.Workers, "workers", 4, "concurrent batches per consumer")
	fs.IntVar(&cfg.MaxConns, "max-conns", 16, "database connections per service")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	cfg.ServiceDB = map[string]string{}
	perService := map[string]*string{}
	for _, s := range databases {
		perService[s] = fs.String(s+"-db", "", "database URL of the "+s+" service (overrides --db)")
		envflag.FileFlag(fs, s+"-db")
	}
	fs.Usage = envflag.Usage(fs, runEnv, runHelpHead, runHelpTail)
	if err := envflag.Parse(fs, args, runEnv); err != nil {
		return cfg, "", err
	}
	if fs.NArg() > 0 {
		return cfg, "", usageError(fmt.Sprintf("unexpected argument %q; run \"shop help\"", fs.Arg(0)))
	}
	cfg.AdminDefault = true
	fs.Visit(func(f *flag.Flag) { cfg.AdminDefault = cfg.AdminDefault && f.Name != "admin-addr" })
	if cfg.AdminAddr == "off" {
		cfg.AdminAddr = ""
	}
	token, err := admin.Token(os.Getenv)
	if err != nil {
		return cfg, "", err
	}
	cfg.AdminToken = token
	cfg.NoAuth, cfg.Pprof = admin.NoAuth, admin.Pprof
	if cfg.AdminAddr != "" {
		if err := adminhttp.Check("--admin-addr", cfg.AdminAddr, cfg.AdminToken != "", cfg.NoAuth, admin.HowToAuth()); err != nil {
			return cfg, "", err
		}
	}
	if cfg.Relay != relayPoll && cfg.Relay != relayCDC {
		return cfg, "", fmt.Errorf("--relay %q: want %s or %s", cfg.Relay, relayPoll, relayCDC)
	}
	switch {
	case cfg.Outbox != outboxRows && cfg.Outbox != outboxLog:
		return cfg, "", fmt.Errorf("--outbox %q: want %s or %s", cfg.Outbox, outboxRows, outboxLog)
	case cfg.Outbox == outboxLog && cfg.Relay != relayCDC:
		return cfg, "", fmt.Errorf("--outbox log needs --relay cdc: only the CDC relay reads events written as WAL messages (the polling relay reads table rows)")
	}
	for s, v := range perService {
		if *v != "" {
			cfg.ServiceDB[s] = *v
		}
	}
	if *services == "all" || *services == "" {
		cfg.Services = allServices
	} else {
		for _, s := range strings.Split(*services, ",") {
			s = strings.TrimSpace(s)
			if !contains(allServices, s) {
				return cfg, "", fmt.Errorf("--services: unknown service %q; want some of %s", s, strings.Join(allServices, ", "))
			}
			if !contains(cfg.Services, s) {
				cfg.Services = append(cfg.Services, s)
			}
		}
	}
	if cfg.has("order") || cfg.has("carrier") {
		if err := adminhttp.Check("--http", cfg.HTTP, false, cfg.NoAuth, "the order API and the fake carrier have no authentication of their own (put them behind a proxy that authenticates)"); err != nil {
			return cfg, "", err
		}
	}
	return cfg, *logLevel, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func defaultDataDir() string {
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "idem-shop")
	}
	return "shop-data"
}

func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(redact.Handler(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))), nil
}

func runMain(args []string, stdout, stderr io.Writer) error {
	// Signals first: a SIGTERM or Ctrl-C at any moment of the start-up
	// (migrations, connecting to the broker, starting the subscribers and
	// relays) stops the shop as cleanly as one after "ready". The first
	// signal cancels ctx and gives the signals back their default action:
	// a second one kills at once.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	context.AfterFunc(ctx, stop)
	cfg, level, err := parseRun(args, stderr)
	if err != nil {
		return err
	}
	log, err := newLogger(stderr, level)
	if err != nil {
		return err
	}
	// What logs to the default logger (the embedded NATS server) logs to
	// the shop's.
	slog.SetDefault(log)
	tracing, err := telemetry.Setup(ctx, "shop", log)
	if err != nil {
		return fmt.Errorf("tracing: %w", err)
	}
	defer tracing.Close(log)
	if tracing.Enabled() {
		log.Info("tracing on", "exporter", tracing.Exporter)
	}
	if err := embeddedDefaults(&cfg); err != nil {
		return err
	}
	if err := checkDataDir(cfg); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "shop: starting")
	a, err := openApp(ctx, cfg, log)
	if err == nil {
		if err = a.start(ctx); err != nil {
			closeApp(a)
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			// Stopped while starting: what failed, failed because of it, and
			// what had started is stopped (openApp and closeApp).
			log.Debug("start-up interrupted", "error", err)
			fmt.Fprintln(stdout, "shop: stopped during start-up")
			return nil
		}
		return err
	}
	a.banner(stdout)
	fmt.Fprintln(stdout, "shop: ready")
	var tick <-chan time.Time
	if cfg.Summary > 0 {
		t := time.NewTicker(cfg.Summary)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-tick:
			fmt.Fprintln(stdout, a.summary(ctx))
			continue
		case <-ctx.Done():
		}
		break
	}
	fmt.Fprintln(stdout, "shop: stopping")
	closeApp(a)
	fmt.Fprintln(stdout, "shop: stopped")
	return nil
}

// shutdownTimeout bounds a graceful stop.
const shutdownTimeout = 30 * time.Second

// closeApp stops a within shutdownTimeout.
func closeApp(a *app) {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	a.close(ctx)
}

// embeddedDefaults fills the database and broker URLs when they are not
// given: SQLite files (one per service) and an embedded NATS JetStream
// server, both under the data directory.
func embeddedDefaults(cfg *runConfig) error {
	if cfg.DB == "" {
		for _, s := range databases {
			if cfg.needsDB(s) && cfg.ServiceDB[s] == "" {
				if cfg.DataDir == "" {
					return errors.New("no --db and no --data-dir: nowhere to keep the SQLite files")
				}
				cfg.DB = "sqlite:" + cfg.DataDir
				break
			}
		}
	}
	if cfg.Broker == "" {
		if cfg.DataDir == "" {
			return errors.New("no --broker and no --data-dir: nowhere to keep the embedded NATS JetStream data")
		}
		cfg.Broker = embeddedBrokerURL(filepath.Join(cfg.DataDir, "nats"))
	}
	return nil
}

// embeddedBrokerURL is the URL of an embedded NATS JetStream server keeping
// its data in dir.
func embeddedBrokerURL(dir string) string {
	return "nats://embedded?dir=" + url.QueryEscape(dir)
}
