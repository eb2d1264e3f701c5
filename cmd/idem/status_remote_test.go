package main

import (
	"net/http"
	"net/http/httptest"
	"regexp"
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

// TestStatusArchive: with events in the CDC relays' archive, idem status
// says which period idem replay can cover, in text and in JSON.
func TestStatusArchive(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	code, out, _ := idem(t, nil, "", "status", "--db", pg.URL)
	if code != 0 || strings.Contains(out, "archive:") {
		t.Fatalf("an empty archive: %d\n%s", code, out)
	}
	pg.Exec(t, `INSERT INTO outbox_archive (outbox_table, id, aggregatetype, aggregateid, type, payload, occurred_at, published_at)
VALUES ('outbox', 'a', 'order', '1', 'order.order.placed.v1', '{}', now() - interval '3 hours', now() - interval '2 hours'),
       ('outbox', 'b', 'order', '1', 'order.order.placed.v1', '{}', now() - interval '11 minutes', now() - interval '10 minutes'),
       ('other_outbox', 'c', 'order', '1', 'order.order.placed.v1', '{}', now() - interval '9 days', now() - interval '9 days')`)
	code, out, errOut := idem(t, nil, "", "status", "--db", pg.URL)
	if code != 0 || !regexp.MustCompile(`\n  archive: events published from 2h00m ago to 10m0\ds ago \(idem replay covers that period\)\n`).MatchString(out) {
		t.Errorf("idem status = %d\n%s%s\nwant the archive's period, of this outbox only", code, out, errOut)
	}
	code, out, _ = idem(t, nil, "", "status", "--db", pg.URL, "--json")
	if code != 0 || !strings.Contains(out, `"archive_oldest_published_at":`) || !strings.Contains(out, `"archive_newest_published_at":`) {
		t.Errorf("idem status --json = %d: %s", code, out)
	}
}
