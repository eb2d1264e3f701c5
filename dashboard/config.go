package dashboard

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/monitor"
)

// Defaults of Config.
const (
	// SampleIntervalDefault is how often the dashboard samples its
	// databases for the charts.
	SampleIntervalDefault = 10 * time.Second
	// HistoryDefault is how far back the charts go.
	HistoryDefault = time.Hour
	// PageSizeDefault is the number of parked messages per page.
	PageSizeDefault = 50
	// QueryTimeoutDefault bounds each read of a database or broker.
	QueryTimeoutDefault = 5 * time.Second
)

// Database is one database the dashboard shows: its figures (Source) and
// its failure store (Store).
type Database struct {
	// Name identifies the database in pages and links ("orders",
	// "stock"). Required, unique among Config.Databases.
	Name string
	// Store is the database's driver, for the failure store
	// (postgres.NewPgx(pool), postgres.NewSQL(db), mysql.New(db),
	// sqlite.New(db)). Required.
	Store inbox.Database
	// Source reads the database's figures (monitor.New over the same
	// driver, with the broker's Inspector when there is one). Required.
	Source *monitor.Source
	// FailureHook, when set, is told of each message the dashboard
	// removes, archives or sends to another consumer, in the transaction
	// that does it (inbox.FailureStore.WithFailureHook): outbox.FailureEvents
	// over the database's outbox writes the notices as events.
	FailureHook inbox.FailureHook
}

// BasicAuth is a user name and password that every request must carry.
type BasicAuth struct {
	// User is the user name; the audit lines name it.
	User string
	// Password is compared in constant time.
	Password string
}

// Config configures a Dashboard.
type Config struct {
	// Databases are the databases shown, in this order. At least one.
	Databases []Database
	// Redeliverer sends a parked message back to the one queue it came
	// from, for the retry button (the publisher of broker/amqp,
	// broker/kafka or broker/nats). Without one, retrying is disabled and
	// the pages say why.
	Redeliverer broker.Redeliverer
	// ConsumerPublisher sends a parked message to another consumer only,
	// for the "send to another consumer" button (the publisher of
	// broker/amqp or broker/nats). Without one, that action is disabled
	// and the pages say why.
	ConsumerPublisher broker.ConsumerPublisher
	// ReadOnly hides the buttons that change messages (retry, edit, send
	// to another consumer, archive, remove) and refuses those actions.
	ReadOnly bool
	// Token, when set, is required on every request: as
	// "Authorization: Bearer <Token>", or as the password of HTTP basic
	// authentication (any user name), which browsers ask for.
	Token string
	// BasicAuth, when set, is required on every request (unless Token is
	// given instead).
	BasicAuth *BasicAuth
	// Path is where the handler is mounted ("/dashboard/"); the handler
	// strips it and builds its links under it. Defaults to "/".
	Path string
	// Logger receives the audit lines (who did what to which message, from
	// where, and the result) and errors. Defaults to slog.Default().
	Logger *slog.Logger
	// Gatherer, when set, is read at each sample for the histograms
	// idem_consumer_commit_to_handle_seconds{consumer}: the charts and the
	// overview show their p50 and p99 over each sampling interval.
	Gatherer prometheus.Gatherer
	// SampleInterval is how often the databases are sampled for the charts
	// (and how often the overview refreshes itself). Defaults to
	// SampleIntervalDefault.
	SampleInterval time.Duration
	// History is how far back the charts go; older samples are dropped.
	// Defaults to HistoryDefault.
	History time.Duration
	// PageSize is the number of parked messages per page. Defaults to
	// PageSizeDefault.
	PageSize int
	// QueryTimeout bounds each read of a database or broker. Defaults to
	// QueryTimeoutDefault.
	QueryTimeout time.Duration
}

// WithDefaults returns cfg with its zero fields set to their defaults.
func (cfg Config) WithDefaults() Config {
	cfg.Path = cmp.Or(cfg.Path, "/")
	if !strings.HasPrefix(cfg.Path, "/") {
		cfg.Path = "/" + cfg.Path
	}
	if !strings.HasSuffix(cfg.Path, "/") {
		cfg.Path += "/"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.SampleInterval = cmp.Or(cfg.SampleInterval, SampleIntervalDefault)
	cfg.History = cmp.Or(cfg.History, HistoryDefault)
	cfg.PageSize = cmp.Or(cfg.PageSize, PageSizeDefault)
	cfg.QueryTimeout = cmp.Or(cfg.QueryTimeout, QueryTimeoutDefault)
	return cfg
}

func (cfg Config) validate() error {
	if len(cfg.Databases) == 0 {
		return errors.New("idem: dashboard: Config.Databases is empty: give at least one database")
	}
	seen := map[string]bool{}
	for i, db := range cfg.Databases {
		switch {
		case db.Name == "":
			return fmt.Errorf("idem: dashboard: Config.Databases[%d].Name is empty", i)
		case seen[db.Name]:
			return fmt.Errorf("idem: dashboard: Config.Databases[%d].Name %q is used twice", i, db.Name)
		case db.Store == nil:
			return fmt.Errorf("idem: dashboard: Config.Databases[%d].Store (%s) is nil", i, db.Name)
		case db.Source == nil:
			return fmt.Errorf("idem: dashboard: Config.Databases[%d].Source (%s) is nil", i, db.Name)
		}
		seen[db.Name] = true
	}
	if cfg.BasicAuth != nil && (cfg.BasicAuth.User == "" || cfg.BasicAuth.Password == "") {
		return errors.New("idem: dashboard: Config.BasicAuth needs a User and a Password")
	}
	if strings.ContainsAny(cfg.Path, "?#") || (&url.URL{Path: cfg.Path}).EscapedPath() != cfg.Path {
		return fmt.Errorf("idem: dashboard: Config.Path %q: want a plain URL path such as /dashboard/", cfg.Path)
	}
	switch {
	case cfg.SampleInterval < 0:
		return errors.New("idem: dashboard: Config.SampleInterval is negative")
	case cfg.History < cfg.SampleInterval:
		return errors.New("idem: dashboard: Config.History is shorter than Config.SampleInterval")
	case cfg.PageSize < 0:
		return errors.New("idem: dashboard: Config.PageSize is negative")
	case cfg.QueryTimeout < 0:
		return errors.New("idem: dashboard: Config.QueryTimeout is negative")
	}
	return nil
}
