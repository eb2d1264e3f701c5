package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-go/idem/dashboard"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/monitor"
)

// TestStatusFromDashboard: "idem status --dashboard URL" prints what the
// databases give, read from a running dashboard's status.json.
func TestStatusFromDashboard(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	statusFixture(t, pg)
	d, err := dashboard.New(dashboard.Config{Path: "/dashboard/", Databases: []dashboard.Database{{Name: "shop order", Store: pg.Driver,
		Source: monitor.New(pg.Driver, monitor.Options{Name: "shop order"})}}})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/dashboard/", d)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	_, direct, _ := idem(t, nil, "", "status", "--db", pg.URL)
	code, out, errOut := idem(t, nil, "", "status", "--dashboard", srv.URL+"/dashboard/")
	if code != 0 {
		t.Fatalf("idem status --dashboard = %d\n%s%s", code, out, errOut)
	}
	if !strings.HasPrefix(out, "shop order  (at ") {
		t.Errorf("want the dashboard's name of the database first:\n%s", out)
	}
	// The lines after the first (the name and the time) are the same,
	// but for the seconds of the ages, which run on.
	strip := func(s string) string {
		_, rest, _ := strings.Cut(s, "\n")
		return strings.Map(func(r rune) rune {
			if r >= '0' && r <= '9' {
				return '#'
			}
			return r
		}, rest)
	}
	if strip(out) != strip(direct) {
		t.Errorf("--dashboard printed\n%s\nthe databases give\n%s", out, direct)
	}

	code, out, _ = idem(t, nil, "", "status", "--dashboard", srv.URL+"/dashboard", "--json")
	if code != 0 || !strings.Contains(out, `"backlog":3`) {
		t.Errorf("--json = %d: %s", code, out)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--dashboard", srv.URL + "/elsewhere/"}, "404 Not Found"},
		{[]string{"--dashboard", "127.0.0.1:9464"}, "http:// or https://"},
		{[]string{"--dashboard", srv.URL, "--db", pg.URL}, "without --db"},
	} {
		code, out, errOut := idem(t, nil, "", append([]string{"status"}, c.args...)...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("idem status %v = %d, want an error saying %q:\n%s%s", c.args, code, c.want, out, errOut)
		}
	}
}
