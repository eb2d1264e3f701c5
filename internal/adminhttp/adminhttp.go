// Package adminhttp serves the admin addresses of the commands (idem relay
// and idem cdc --metrics-addr, shop --admin-addr) and holds the listen
// policy every address of the commands follows, idem dashboard --http and
// the shop's --http included:
//
//   - an address on loopback (127.0.0.1:9464, [::1]:9464, localhost:9464)
//     is served as it is: only this machine reaches it;
//   - an address beyond loopback (0.0.0.0:9464, :9464, 10.0.0.5:9464) is
//     refused at start unless requests must carry a bearer token
//     (--auth-token-file, or the command's variable) or the operator says
//     with --insecure-no-auth that something in front authenticates (Check);
//   - a token, when set, is required on every path (Authorization: Bearer
//     TOKEN, or as the password of HTTP basic authentication, which browsers
//     ask for), compared in constant time, but /healthz, which answers "ok"
//     or "not ok" and nothing else to a request without it;
//   - the Go profiles (/debug/pprof/) are served only when asked (--pprof),
//     and never /debug/pprof/cmdline: the command line may hold a password.
//
// A token never comes from the command line, where ps and /proc show it to
// every user of the machine: Flags reads it from a file or a variable.
//
// The package imports net/http/pprof, which also registers the profiles on
// http.DefaultServeMux: the commands never serve it, and the dashboard, a
// public package, imports tokenauth only.
package adminhttp

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"html/template"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	runtimepprof "runtime/pprof"
	"sync"
	"time"

	"github.com/idem-go/idem/internal/adminhttp/tokenauth"
	"github.com/idem-go/idem/internal/envflag"
	"github.com/idem-go/idem/internal/redact"
)

// IsLoopback reports whether the host of addr (host:port) is a loopback
// address or "localhost". An empty host listens on every interface: false.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Check applies the listen policy to addr, the value of the flag addrFlag:
// beyond loopback it needs authentication (authenticated) or noAuth
// (--insecure-no-auth). howToAuth, when set, says how to authenticate
// ("give --auth-token-file FILE"), for the error.
func Check(addrFlag, addr string, authenticated, noAuth bool, howToAuth string) error {
	if authenticated || noAuth || IsLoopback(addr) {
		return nil
	}
	how := "it has no authentication of its own"
	if howToAuth != "" {
		how = howToAuth
	}
	return fmt.Errorf("%s %s listens beyond loopback without authentication: %s; or give --insecure-no-auth if something in front of it authenticates; or listen on loopback (127.0.0.1:PORT)",
		addrFlag, addr, how)
}

// Flags are the flags of an admin address, declared by Register.
type Flags struct {
	// TokenFile is --auth-token-file: the file holding the token.
	TokenFile string
	// NoAuth is --insecure-no-auth.
	NoAuth bool
	// Pprof is --pprof.
	Pprof bool

	addrFlag, tokenEnv string
}

// Register declares --auth-token-file, --insecure-no-auth and, when pprof
// is true, --pprof on fs, for the address of the flag addrFlag
// ("--metrics-addr"); tokenEnv names the variable that may hold the token
// instead of a file.
func (f *Flags) Register(fs *flag.FlagSet, addrFlag, tokenEnv string, pprof bool) {
	f.addrFlag, f.tokenEnv = addrFlag, tokenEnv
	fs.StringVar(&f.TokenFile, "auth-token-file", "", "file holding the bearer token that every request to "+addrFlag+" must carry\n(Authorization: Bearer TOKEN; its trailing newline removed); default: the token in\n$"+tokenEnv+". Required beyond loopback unless --insecure-no-auth")
	fs.BoolVar(&f.NoAuth, "insecure-no-auth", false, "let "+addrFlag+" listen beyond loopback without a token (something in front of it authenticates)")
	if pprof {
		fs.BoolVar(&f.Pprof, "pprof", false, "serve the Go profiles on "+addrFlag+" under /debug/pprof/ (they show the program's memory)")
	}
}

// HowToAuth says how to give the token, for Check's error.
func (f *Flags) HowToAuth() string {
	return "give --auth-token-file FILE (or set $" + f.tokenEnv + ") so that every request needs that bearer token"
}

// Token returns the token of --auth-token-file, else the value of the
// variable (getenv), else "".
func (f *Flags) Token(getenv func(string) string) (string, error) {
	if f.TokenFile != "" {
		t, err := envflag.ReadFile(f.TokenFile)
		if err != nil {
			return "", fmt.Errorf("--auth-token-file: %w", err)
		}
		return t, nil
	}
	return getenv(f.tokenEnv), nil
}

// Config returns the configuration of a server on addr with these flags:
// the token read, the policy checked (Listen checks it too).
func (f *Flags) Config(addr string, getenv func(string) string, log *slog.Logger) (Config, error) {
	token, err := f.Token(getenv)
	if err != nil {
		return Config{}, err
	}
	cfg := Config{Addr: addr, AddrFlag: f.addrFlag, HowToAuth: f.HowToAuth(), Token: token, NoAuth: f.NoAuth, Pprof: f.Pprof, Logger: log}
	return cfg, Check(cfg.AddrFlag, addr, token != "", f.NoAuth, cfg.HowToAuth)
}

// Config configures a Server.
type Config struct {
	// Addr is the host:port to listen on.
	Addr string
	// AddrFlag names the flag of Addr, for errors ("--metrics-addr").
	AddrFlag string
	// HowToAuth says how to set Token, for the policy's error.
	HowToAuth string
	// Token, when set, is required on every path but /healthz.
	Token string
	// NoAuth lets Addr be beyond loopback without Token.
	NoAuth bool
	// Pprof serves the Go profiles under /debug/pprof/, the command line
	// never.
	Pprof bool
	// Logger receives the server's errors. Defaults to slog.Default().
	Logger *slog.Logger
}

// Server is an admin address: a mux behind the token, listening from
// Listen on, served from Start to Shutdown.
type Server struct {
	cfg Config
	// health is set once HandleHealth serves HealthPath.
	health bool
	mux    *http.ServeMux
	ln     net.Listener
	srv    *http.Server
	wg     sync.WaitGroup
}

// Listen checks cfg.Addr against the policy (Check) and listens on it, so
// that a taken address fails the start-up before anything else starts.
// Add the handlers with Handle and HandleHealth, then Start.
func Listen(cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := Check(cfg.AddrFlag, cfg.Addr, cfg.Token != "", cfg.NoAuth, cfg.HowToAuth); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux(), ln: ln}
	if cfg.Pprof {
		registerPprof(s.mux)
	}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(redact.Handler(cfg.Logger.Handler()), slog.LevelWarn)}
	return s, nil
}

// Addr is the address the server listens on (the port chosen for ":0").
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Pprof reports whether the server serves the Go profiles.
func (s *Server) Pprof() bool { return s.cfg.Pprof }

// Authenticated reports whether the server requires a token.
func (s *Server) Authenticated() bool { return s.cfg.Token != "" }

// Handle serves pattern (http.ServeMux's) with h, behind the token.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// HealthPath is where HandleHealth serves.
const HealthPath = "/healthz"

// HandleHealth serves HealthPath, without the token, so that load
// balancers and probes reach it: 200 "ok" while healthy returns nil, 503
// "not ok" otherwise, followed by the reason (redacted) only for a request
// that carries the token, or when the server has none.
func (s *Server) HandleHealth(healthy func() error) {
	s.health = true
	s.mux.HandleFunc(HealthPath, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		err := healthy()
		if err == nil {
			fmt.Fprintln(w, "ok")
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		if s.authorized(r) {
			fmt.Fprintln(w, "not ok:", redact.String(err.Error()))
			return
		}
		fmt.Fprintln(w, "not ok")
	})
}

// ServeHTTP serves the mux to requests that carry the token (every request
// when there is none), and HealthPath, when HandleHealth serves it, to all.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !(s.health && r.URL.Path == HealthPath) && !s.authorized(r) {
		Unauthorized(w, "idem")
		return
	}
	s.mux.ServeHTTP(w, r)
}

func (s *Server) authorized(r *http.Request) bool {
	if s.cfg.Token == "" {
		return true
	}
	_, ok := tokenauth.Check(r, s.cfg.Token)
	return ok
}

// Unauthorized answers 401 with the challenges of a bearer token and of
// basic authentication (browsers show a login prompt for the latter).
func Unauthorized(w http.ResponseWriter, realm string) {
	w.Header().Add("WWW-Authenticate", `Bearer realm="`+realm+`"`)
	w.Header().Add("WWW-Authenticate", `Basic realm="`+realm+`", charset="UTF-8"`)
	http.Error(w, realm+": authentication required (Authorization: Bearer TOKEN)", http.StatusUnauthorized)
}

// Start serves in the background until Shutdown or Close; an error
// serving is logged.
func (s *Server) Start() {
	s.wg.Go(func() {
		if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.cfg.Logger.Error("admin server stopped", "addr", s.ln.Addr().String(), "error", err)
		}
	})
}

// Shutdown stops the server gracefully (http.Server.Shutdown), closing the
// listener when it was never started, and waits for Start's goroutine.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	_ = s.ln.Close()
	s.wg.Wait()
	return err
}

// Close stops the server at once.
func (s *Server) Close() error {
	err := s.srv.Close()
	_ = s.ln.Close()
	s.wg.Wait()
	return err
}

// registerPprof serves the Go profiles under /debug/pprof/: an index of
// its own (net/http/pprof's links the command line), the named profiles
// (heap, goroutine, allocs, block, mutex, threadcreate), profile (CPU,
// ?seconds=N), symbol and trace. /debug/pprof/cmdline is 404: a command
// line may hold a password.
func registerPprof(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/debug/pprof/" {
			pprof.Index(w, r) // a named profile
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		var names []string
		for _, p := range runtimepprof.Profiles() {
			names = append(names, p.Name())
		}
		_ = pprofIndex.Execute(w, names)
	})
	mux.Handle("/debug/pprof/cmdline", http.NotFoundHandler())
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}

var pprofIndex = template.Must(template.New("index").Parse(`<!DOCTYPE html>
<html><head><title>/debug/pprof/</title></head><body>
<h1>/debug/pprof/</h1>
<p>Profiles (go tool pprof FILE, once fetched):</p>
<ul>
{{range .}}<li><a href="{{.}}?debug=1">{{.}}</a></li>
{{end}}<li><a href="profile?seconds=5">profile</a> (CPU, ?seconds=N)</li>
<li><a href="trace?seconds=1">trace</a> (execution trace, ?seconds=N)</li>
</ul>
</body></html>
`))
