package dashboard_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/dashboard"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/relay"
)

// TestPauseAndResume: an operator pauses a consumer and the relay from the
// dashboard's forms (confirmation and CSRF token as for every action);
// the pauses are recorded where the consumers and relays read them,
// audited with who, shown on the overview with a Resume link, and
// removed by it. A read-only dashboard offers none of it.
func TestPauseAndResume(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	consumerPath := "/dashboard/pauses/stock/consumer/shipping/pause"
	if resp := b.post(t, consumerPath, url.Values{"reason": {"x"}}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST without a token: %d, want 403", resp.StatusCode)
	}
	token := b.confirmToken(t, consumerPath)
	resp := b.post(t, consumerPath, url.Values{"csrf": {token}, "reason": {"carrier maintenance"}, "for": {"2h"}}, "Origin", b.srv.URL)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("pause POST: %d, want 303", resp.StatusCode)
	}
	ps, err := inbox.NewPauseStore(b.pg.Driver).List(ctx)
	if err != nil || len(ps) != 1 || ps[0].Name != "shipping" || ps[0].Reason != "carrier maintenance" || ps[0].By != "anonymous" ||
		time.Until(ps[0].Until) < time.Hour || !ps[0].ActiveAt(time.Now()) {
		t.Fatalf("consumer pauses = %+v, %v; want shipping's, for 2h, by anonymous", ps, err)
	}
	relayPath := "/dashboard/pauses/stock/relay/outbox/pause"
	token = b.confirmToken(t, relayPath)
	if resp := b.post(t, relayPath, url.Values{"csrf": {token}, "for": {"soon"}}, "Origin", b.srv.URL); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a pause for \"soon\": %d, want 400", resp.StatusCode)
	}
	if resp := b.post(t, relayPath, url.Values{"csrf": {token}, "reason": {"broker upgrade"}}, "Origin", b.srv.URL); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("relay pause POST: %d, want 303", resp.StatusCode)
	}
	rs, err := relay.NewPauseStore(b.pg.Driver).List(ctx)
	if err != nil || len(rs) != 1 || rs[0].Name != "outbox" || !rs[0].Until.IsZero() {
		t.Fatalf("relay pauses = %+v, %v; want the outbox's, until resumed", rs, err)
	}

	code, body := b.get(t, "/dashboard/")
	for _, want := range []string{`data-pause="consumer/shipping"`, "carrier maintenance", `data-pause="relay/outbox"`, "broker upgrade",
		"/dashboard/pauses/stock/relay/outbox/resume"} {
		if code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("the overview (%d) lacks %q", code, want)
		}
	}
	resumePath := "/dashboard/pauses/stock/relay/outbox/resume"
	token = b.confirmToken(t, resumePath)
	if resp := b.post(t, resumePath, url.Values{"csrf": {token}}, "Origin", b.srv.URL); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("resume POST: %d, want 303", resp.StatusCode)
	}
	if rs, err := relay.NewPauseStore(b.pg.Driver).List(ctx); err != nil || len(rs) != 0 {
		t.Errorf("relay pauses after resume = %+v, %v; want none", rs, err)
	}
	logs := b.logs.String()
	for _, want := range []string{"dashboard: pause", "kind=consumer", "name=shipping", "dashboard: resume", "result=resumed", "user=anonymous"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the audit log lacks %q:\n%s", want, logs)
		}
	}

	ro := setupWith(t, b.pg.Driver, func(c *dashboard.Config) { c.ReadOnly = true })
	if code, _ := ro.get(t, consumerPath); code != http.StatusForbidden {
		t.Errorf("read-only pause page: %d, want 403", code)
	}
	if code, body := ro.get(t, "/dashboard/"); code != http.StatusOK || strings.Contains(body, "/pauses/") {
		t.Errorf("a read-only overview (%d) links to pauses", code)
	}
	if ps, _ := inbox.NewPauseStore(b.pg.Driver).List(ctx); len(ps) != 1 || ps[0].Kind != idem.PauseConsumer {
		t.Errorf("consumer pauses = %+v, want shipping's still", ps)
	}
}
