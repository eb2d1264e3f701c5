package dashboard

import (
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"

	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/redact"
	"github.com/idem-go/idem/internal/startstop"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Dashboard is the dashboard's http.Handler. Start begins sampling the
// databases for the charts; Stop ends it. The pages work without Start,
// with empty charts.
type Dashboard struct {
	cfg     Config
	log     *slog.Logger
	stores  map[string]*inbox.FailureStore
	pages   map[string]*template.Template
	handler http.Handler
	origin  *http.CrossOriginProtection
	csrfKey []byte
	hist    history

	base startstop.Base
}

// New returns a dashboard over cfg's databases. It checks the
// configuration; it does not connect to anything.
func New(cfg Config) (*Dashboard, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	d := &Dashboard{
		cfg: cfg, log: cfg.Logger, stores: map[string]*inbox.FailureStore{},
		origin: http.NewCrossOriginProtection(), csrfKey: make([]byte, 32),
		hist: history{keep: cfg.History},
	}
	_, _ = rand.Read(d.csrfKey)
	for _, db := range cfg.Databases {
		d.stores[db.Name] = inbox.NewFailureStore(db.Store).WithFailureHook(db.FailureHook)
	}
	var err error
	if d.pages, err = parsePages(); err != nil {
		return nil, err
	}
	d.origin.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.log.Warn("dashboard: action refused", "method", r.Method, "path", r.URL.Path, "user", user(r), "remote", r.RemoteAddr,
			"result", "refused: cross-origin request")
		d.refuse(w, r, http.StatusForbidden, "This request comes from another site: the dashboard refuses it. Use the dashboard's own pages.")
	}))
	d.handler = http.StripPrefix(strings.TrimSuffix(cfg.Path, "/"), d.routes())
	return d, nil
}

// parsePages parses every page with the layout.
func parsePages() (map[string]*template.Template, error) {
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	out := map[string]*template.Template{}
	for _, n := range names {
		name := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if name == "layout" {
			continue
		}
		t, err := template.New(name).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", n)
		if err != nil {
			return nil, fmt.Errorf("dashboard: template %s: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

func (d *Dashboard) routes() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /{$}", d.overview)
	mux.HandleFunc("GET /status.json", d.statusJSON)
	mux.HandleFunc("GET /messages", d.messages)
	mux.HandleFunc("GET /messages/{db}/{id}", d.message)
	mux.HandleFunc("GET /messages/{db}/{id}/{action}", d.confirm)
	mux.HandleFunc("POST /messages/{db}/{id}/{action}", d.act)
	mux.HandleFunc("GET /bulk/{db}/{action}", d.bulkConfirm)
	mux.HandleFunc("POST /bulk/{db}/{action}", d.bulkAct)
	mux.HandleFunc("GET /pauses/{db}/{kind}/{name}/{action}", d.pauseConfirm)
	mux.HandleFunc("POST /pauses/{db}/{kind}/{name}/{action}", d.pauseAct)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			d.refuse(w, r, http.StatusMethodNotAllowed, "Only GET here: actions are POSTed from their confirmation page.")
			return
		}
		d.refuse(w, r, http.StatusNotFound, "No such page.")
	})
	return mux
}

// ServeHTTP serves the dashboard's pages under Config.Path.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	who, ok := d.authenticate(r)
	if !ok {
		if d.cfg.Token != "" {
			h.Add("WWW-Authenticate", `Bearer realm="idem dashboard"`)
		}
		h.Add("WWW-Authenticate", `Basic realm="idem dashboard", charset="UTF-8"`)
		http.Error(w, "idem dashboard: authentication required", http.StatusUnauthorized)
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), userKey{}, who))
	if r.Method == http.MethodPost {
		// Cross-origin POSTs are refused before anything reads the form.
		d.origin.Handler(d.handler).ServeHTTP(w, r)
		return
	}
	d.handler.ServeHTTP(w, r)
}

type userKey struct{}

func user(r *http.Request) string {
	s, _ := r.Context().Value(userKey{}).(string)
	return s
}

// Start starts sampling the databases every Config.SampleInterval, for the
// charts. ctx bounds the start-up only. It returns an error wrapping
// idem.ErrStarted or idem.ErrStopped when the dashboard was started or
// stopped before.
func (d *Dashboard) Start(ctx context.Context) error {
	if err := d.base.Starting(); err != nil {
		return fmt.Errorf("idem: dashboard: %w", err)
	}
	run := d.base.StopContext() // the sampling ends at Stop
	go func() {
		defer d.base.Finished()
		d.run(run)
	}()
	d.base.Running()
	return nil
}

// Stop stops the sampling and returns once it has ended, or with ctx's
// error when ctx ends first (Done is closed when it has ended). It is
// idempotent; the pages keep working, with the samples taken so far.
func (d *Dashboard) Stop(ctx context.Context) error { return d.base.Stop(ctx, nil, nil) }

// Done is closed once the sampling has ended (or the dashboard was stopped
// before it started).
func (d *Dashboard) Done() <-chan struct{} { return d.base.Done() }

// explain says what an error reading a database means, without the
// secrets its text may quote (a URL's password).
func explain(err error) string {
	if err == nil {
		return ""
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "the database did not answer in time (" + redact.String(err.Error()) + ")"
	}
	return redact.String(err.Error())
}
