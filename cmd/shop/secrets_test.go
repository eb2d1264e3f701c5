package main

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/adminhttp/adminhttptest"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/tools/shopkit"
)

// TestSecretsStayInProcess (guarantee G15): the shop, started with
// passwords in its --db and --broker URLs and a token, its admin address
// beyond loopback with --pprof, serves every admin path to the token only
// (the Go profiles without the command line), and neither an answer of
// the admin address or of the order API nor a line of its output holds a
// password or the token. An admin address or an order API beyond loopback
// without a token is refused at start, naming --insecure-no-auth.
func TestSecretsStayInProcess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base := testdb.PostgresURL(t)
	dbURL, dbPassword := testdb.WithPassword(t, base)
	brokerURL, brokerPassword := testamqp.UserURL(t)
	token := "tok" + shopkit.RandomSuffix()
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	secrets := []string{dbPassword, brokerPassword, token}
	ns := "sec_" + shopkit.RandomSuffix()
	in, err := shopkit.OpenInspector(ctx, base, ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.DropNamespace(); in.Close() })

	httpAddr, err := shopkit.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	local, err := shopkit.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := strings.Cut(local, ":")
	admin, adminBase := "0.0.0.0:"+port, "http://127.0.0.1:"+port
	args := []string{"--services", "all", "--db", dbURL, "--broker", brokerURL, "--namespace", ns,
		"--http", httpAddr, "--admin-addr", admin, "--summary", "0", "--log-level", "debug", "--relay-lease", "2s"}

	cl := &shopkit.Cluster{Binary: shopBinary, LogDir: t.TempDir()}
	t.Cleanup(cl.StopAll)
	for _, refused := range []struct {
		name, addr string
		extra      []string
	}{
		{"--admin-addr", admin, nil},
		{"--http", "0.0.0.0:" + port, []string{"--admin-addr", local}},
	} {
		refusedArgs := append(append(append([]string{}, args...), refused.extra...), refused.name, refused.addr)
		p, err := cl.Run(ctx, "refused", "", "", refusedArgs)
		if err == nil {
			p.Kill() // not refused: it fails below, and must not hold the addresses
		}
		out := p.Stdout() + p.LogText()
		if !errors.Is(err, shopkit.ErrExitedAtStart) || !strings.Contains(out, refused.name+" "+refused.addr+" listens beyond loopback without authentication") ||
			!strings.Contains(out, "--insecure-no-auth") {
			t.Errorf("shop %s %s without a token: %v, want a refusal naming --insecure-no-auth:\n%s", refused.name, refused.addr, err, out)
		}
		adminhttptest.NoSecret(t, "the refused shop's output", out, secrets...)
	}

	p, err := cl.Run(ctx, "shop", httpAddr, "", append(args, "--auth-token-file", tokenFile, "--pprof"))
	if err != nil {
		t.Fatal(err)
	}
	id, err := shopkit.PlaceOK(ctx, httpAddr, "c-secret", 2)
	if err != nil {
		t.Fatal(err)
	}
	waitFulfilment(t, httpAddr, id)
	for _, path := range []string{"/orders/" + id, "/carrier/stats", "/debug/pprof/cmdline"} {
		_, answer := adminhttptest.Get(t, "http://"+httpAddr, path, "")
		adminhttptest.NoSecret(t, "the order API's GET "+path, answer, secrets...)
	}

	paths := []adminhttptest.Path{
		{Path: "/", Status: http.StatusOK},
		{Path: "/metrics", Status: http.StatusOK},
		{Path: "/healthz", Status: http.StatusOK, Open: []string{"ok\n"}},
		{Path: "/dashboard/", Status: http.StatusOK},
		{Path: "/dashboard/status.json", Status: http.StatusOK},
		{Path: "/dashboard/messages", Status: http.StatusOK},
		{Path: "/dashboard/static/style.css", Status: http.StatusOK},
		{Path: "/nothing", Status: http.StatusNotFound},
	}
	paths = append(paths, adminhttptest.PprofPaths(t, adminBase, token)...)
	bodies := adminhttptest.Check(t, adminBase, token, paths, secrets...)
	if !strings.Contains(bodies["/metrics"], "idem_relay_published_total") || !strings.Contains(bodies["/dashboard/"], "order") {
		t.Errorf("the admin address does not serve the shop's figures: the test checks nothing\n%.2000s", bodies["/metrics"])
	}

	if err := p.Stop(); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, p.Tail())
	}
	out := p.Stdout() + p.LogText()
	adminhttptest.NoSecret(t, "the shop's output", out, secrets...)
	if !strings.Contains(out, ":xxxxx@127.0.0.1") {
		t.Errorf("the shop does not print its broker's URL, redacted: the test checks nothing\n%s", p.Stdout())
	}
}
