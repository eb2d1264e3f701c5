package nats_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/nats"
	"github.com/idem-go/idem/internal/testtls"
)

// runServer starts a nats-server with JetStream and opts' security
// settings, and shuts it down at cleanup.
func runServer(t *testing.T, opts *natsserver.Options) *natsserver.Server {
	t.Helper()
	opts.Host, opts.Port, opts.JetStream, opts.StoreDir = "127.0.0.1", -1, true, t.TempDir()
	opts.NoSigs, opts.NoLog = true, true
	s, err := natsserver.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// publishVia opens a publisher from a URL as idem's commands do
// (nats.ParseURL) and publishes one event.
func publishVia(t *testing.T, rawURL string) error {
	t.Helper()
	c, err := nats.ParseURL(rawURL)
	if err != nil {
		t.Fatalf("ParseURL: %v", err)
	}
	cfg := c.PublisherConfig()
	cfg.ConnConfig.DialTimeout = 5 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := nats.NewPublisher(ctx, cfg)
	if err != nil {
		return err
	}
	defer p.Close()
	ev, err := idem.NewEvent("order.order.placed.v1", "order", "42", map[string]any{"total": 1})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := idem.NewMessage(ev)
	if err != nil {
		t.Fatal(err)
	}
	return p.Publish(ctx, []idem.Message{msg})
}

// TestTLSURL: tls://host:port?ca=&cert=&key= reaches a server that
// requires TLS and a client certificate signed by a private CA; the same
// URL without the client certificate is refused by the server, and one
// trusting another CA (or the system's roots) refuses the server.
func TestTLSURL(t *testing.T) {
	t.Parallel()
	pki := testtls.New(t)
	s := runServer(t, &natsserver.Options{TLS: true, TLSVerify: true, TLSConfig: pki.ServerConfig(t, true), TLSTimeout: 5})
	addr := s.Addr().String()
	n := newNames()
	url := "tls://" + addr + "?stream=" + n.stream.Name + "&prefix=" + n.stream.SubjectPrefix +
		"&ca=" + pki.CA + "&cert=" + pki.ClientCert + "&key=" + pki.ClientKey

	if err := publishVia(t, url); err != nil {
		t.Fatalf("publish over TLS with a client certificate: %v", err)
	}
	for _, c := range []struct {
		what, url, want string
	}{
		// The server's refusal: its alert, or (under TLS 1.3, when the
		// client writes before reading it) nats.go's reading of the close.
		{"no client certificate", testtls.SetQuery(t, url, "cert", "", "key", ""), "tls: certificate required|connection closed by remote after TLS handshake"},
		{"another CA", testtls.SetQuery(t, url, "ca", testtls.New(t).CA), "certificate signed by unknown authority"},
		{"the system's roots", testtls.SetQuery(t, url, "ca", ""), "certificate signed by unknown authority"},
	} {
		if err := publishVia(t, c.url); err == nil || !regexp.MustCompile(c.want).MatchString(err.Error()) {
			t.Errorf("%s: %v, want an error saying %q", c.what, err, c.want)
		}
	}
}

// TestCredsURL: ?creds= names a credentials file (a user's JWT and seed,
// as nsc writes it) for a server in operator mode: its user publishes; a
// user of an account the operator did not sign is refused.
func TestCredsURL(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	operator, _ := nkeys.CreateOperator()
	opub, _ := operator.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	sys, sysJWT := account(t, operator, false)
	app, appJWT := account(t, operator, true)
	oc.SystemAccount = pub(t, sys)
	if _, err := oc.Encode(operator); err != nil {
		t.Fatal(err)
	}
	resolver := &natsserver.MemAccResolver{}
	for a, j := range map[string]string{pub(t, sys): sysJWT, pub(t, app): appJWT} {
		if err := resolver.Store(a, j); err != nil {
			t.Fatal(err)
		}
	}
	s := runServer(t, &natsserver.Options{TrustedOperators: []*jwt.OperatorClaims{oc}, AccountResolver: resolver, SystemAccount: pub(t, sys)})
	n := newNames()
	url := "nats://" + s.Addr().String() + "?stream=" + n.stream.Name + "&prefix=" + n.stream.SubjectPrefix + "&creds="

	good := filepath.Join(dir, "app.creds")
	writeCreds(t, good, app)
	if err := publishVia(t, url+good); err != nil {
		t.Fatalf("publish with the credentials file: %v", err)
	}
	stranger, _ := nkeys.CreateOperator()
	other, _ := account(t, stranger, true)
	bad := filepath.Join(dir, "other.creds")
	writeCreds(t, bad, other)
	err := publishVia(t, url+bad)
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Fatalf("a user of an account the operator did not sign: %v, want an authorization error", err)
	}
	if err := publishVia(t, url+filepath.Join(dir, "missing.creds")); err == nil || !strings.Contains(err.Error(), "missing.creds") {
		t.Fatalf("a missing credentials file: %v, want an error naming it", err)
	}
}

func pub(t *testing.T, kp nkeys.KeyPair) string {
	t.Helper()
	p, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// account returns a new account signed by operator, with JetStream when
// js is true.
func account(t *testing.T, operator nkeys.KeyPair, js bool) (nkeys.KeyPair, string) {
	t.Helper()
	kp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	ac := jwt.NewAccountClaims(pub(t, kp))
	if js {
		ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	}
	j, err := ac.Encode(operator)
	if err != nil {
		t.Fatal(err)
	}
	return kp, j
}

// writeCreds writes the credentials file of a new user of account.
func writeCreds(t *testing.T, path string, account nkeys.KeyPair) {
	t.Helper()
	user, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	j, err := jwt.NewUserClaims(pub(t, user)).Encode(account)
	if err != nil {
		t.Fatal(err)
	}
	seed, err := user.Seed()
	if err != nil {
		t.Fatal(err)
	}
	creds, err := jwt.FormatUserConfig(j, seed)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		t.Fatal(err)
	}
}
