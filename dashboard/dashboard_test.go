package dashboard_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/dashboard"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/monitor"
)

// syncBuffer collects log lines from the handler's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// bundle is what a test needs: a database with idem's tables, its failure
// store, a dashboard over it served by an httptest server, a browser-like
// client (cookies kept, redirects not followed) and the audit log.
type bundle struct {
	pg     *testdb.PG
	store  *inbox.FailureStore
	d      *dashboard.Dashboard
	srv    *httptest.Server
	client *http.Client
	logs   *syncBuffer
}

func setup(t *testing.T, configure func(*dashboard.Config)) *bundle {
	t.Helper()
	pg := testdb.NewPostgres(t)
	b := setupWith(t, pg.Driver, configure)
	b.pg = pg
	return b
}

// setupWith is setup over db, of any dialect; the bundle has no pg.
func setupWith(t *testing.T, db monitor.Database, configure func(*dashboard.Config)) *bundle {
	t.Helper()
	b := &bundle{store: inbox.NewFailureStore(db), logs: &syncBuffer{}}
	cfg := dashboard.Config{
		Databases: []dashboard.Database{{Name: "stock", Store: db,
			Source: monitor.New(db, monitor.Options{Name: "stock", Consumers: []string{"stock"}})}},
		Path:   "/dashboard/",
		Logger: slog.New(slog.NewTextHandler(b.logs, nil)),
	}
	if configure != nil {
		configure(&cfg)
	}
	d, err := dashboard.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b.d = d
	mux := http.NewServeMux()
	mux.Handle("/dashboard/", d)
	b.srv = httptest.NewServer(mux)
	t.Cleanup(b.srv.Close)
	jar, _ := cookiejar.New(nil)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	b.client = &http.Client{Jar: jar, Timeout: 30 * time.Second, Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return b
}

// park stores a message as a consumer parks it and returns its id.
func (b *bundle) park(t *testing.T, m idem.FailedMessage) int64 {
	t.Helper()
	if m.Consumer == "" {
		m.Consumer = "stock"
	}
	if m.Error == "" {
		m.Error = "boom"
	}
	if m.Attempts == 0 {
		m.Attempts = 1
	}
	id, err := b.store.Save(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func (b *bundle) get(t *testing.T, path string, header ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", b.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := b.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func (b *bundle) post(t *testing.T, path string, form url.Values, header ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("POST", b.srv.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := b.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// confirmToken loads a confirmation page and returns its form's token.
func (b *bundle) confirmToken(t *testing.T, path string) string {
	t.Helper()
	code, body := b.get(t, path)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d\n%s", path, code, body)
	}
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("GET %s: no CSRF token in the form:\n%s", path, body)
	}
	return m[1]
}

func (b *bundle) exists(t *testing.T, id int64) bool {
	t.Helper()
	_, err := b.store.Get(context.Background(), id)
	if err != nil && err != idem.ErrNotFound && !strings.Contains(err.Error(), "not found") {
		t.Fatal(err)
	}
	return err == nil
}

func TestMessagePage(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ev := uuid.New()
	text := b.park(t, idem.FailedMessage{Source: "stock.events", EventID: ev, EventName: "order.order.placed.v1",
		AggregateType: "order", AggregateID: "42", Headers: map[string]string{"x-trace": "abc", "idem-attempt": "3"},
		Body: []byte(`{"event_id":"1","payload":{"note":"<script>alert(1)</script>"}}`), Error: "quantity \"-7\" is not positive", Attempts: 3})
	binary := b.park(t, idem.FailedMessage{Source: "stock.events", Body: []byte{0, 1, 2, 0xff, 'h', 'i'}, Error: "undecodable"})
	held := b.park(t, idem.FailedMessage{Source: "stock.events", EventID: uuid.New(), EventName: "order.order.cancelled.v1",
		AggregateType: "order", AggregateID: "42", HeldBy: text, Body: []byte(`{}`), Error: "held behind an earlier event of its aggregate"})

	code, page := b.get(t, fmt.Sprintf("/dashboard/messages/stock/%d", text))
	if code != http.StatusOK {
		t.Fatalf("status %d\n%s", code, page)
	}
	for _, want := range []string{ev.String(), "order.order.placed.v1", "order 42", "x-trace", "idem-attempt",
		"&lt;script&gt;alert(1)&lt;/script&gt;", "quantity &#34;-7&#34; is not positive", fmt.Sprintf(`/dashboard/messages/stock/%d"`, held),
		`id="retry" disabled`, "Retrying needs a broker", `id="remove"`} {
		if !strings.Contains(page, want) {
			t.Errorf("the message page lacks %q", want)
		}
	}
	if strings.Contains(page, "<script>") {
		t.Error("the body is not escaped")
	}
	code, page = b.get(t, fmt.Sprintf("/dashboard/messages/stock/%d", binary))
	if code != http.StatusOK || !strings.Contains(page, "hex dump") || !strings.Contains(page, "00 01 02 ff 68 69") {
		t.Errorf("binary body: status %d, want a hex dump:\n%s", code, page)
	}
	code, page = b.get(t, fmt.Sprintf("/dashboard/messages/stock/%d", held))
	if code != http.StatusOK || !strings.Contains(page, fmt.Sprintf(`/dashboard/messages/stock/%d">%d</a> (waits behind`, text, text)) {
		t.Errorf("held message: status %d, want a link to the message it waits behind:\n%s", code, page)
	}
	if code, page := b.get(t, "/dashboard/messages/stock/999999"); code != http.StatusNotFound || !strings.Contains(page, "applied after a retry, or removed") {
		t.Errorf("missing message: status %d\n%s", code, page)
	}
	if code, _ := b.get(t, "/dashboard/messages/orders/1"); code != http.StatusNotFound {
		t.Errorf("unknown database: status %d, want 404", code)
	}
}

func TestMessagesFilters(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *dashboard.Config) { c.PageSize = 3 })
	var stock, billing []int64
	for i := range 5 {
		stock = append(stock, b.park(t, idem.FailedMessage{Source: "stock.events", EventID: uuid.New(), EventName: "order.order.placed.v1", Body: []byte(fmt.Sprint(i))}))
	}
	for i := range 4 {
		billing = append(billing, b.park(t, idem.FailedMessage{Consumer: "billing", Source: fmt.Sprintf("billing-%d.events", i%2), EventID: uuid.New(), EventName: "order.order.cancelled.v1", Body: []byte(fmt.Sprint(i))}))
	}
	ids := func(page string) []string {
		var out []string
		for _, m := range regexp.MustCompile(`data-id="(\d+)"`).FindAllStringSubmatch(page, -1) {
			out = append(out, m[1])
		}
		return out
	}
	str := func(ids ...int64) []string {
		var out []string
		for _, id := range ids {
			out = append(out, fmt.Sprint(id))
		}
		return out
	}
	check := func(path string, want []string) string {
		t.Helper()
		code, page := b.get(t, path)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d\n%s", path, code, page)
		}
		if got := ids(page); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("GET %s: ids %v, want %v", path, got, want)
		}
		return page
	}
	// Newest first, three per page, then the next page.
	page := check("/dashboard/messages?db=stock&consumer=stock", str(stock[4], stock[3], stock[2]))
	next := regexp.MustCompile(`href="([^"]+)" rel="next"`).FindStringSubmatch(page)
	if next == nil {
		t.Fatalf("no next page link:\n%s", page)
	}
	check(strings.ReplaceAll(next[1], "&amp;", "&"), str(stock[1], stock[0]))
	check("/dashboard/messages?event=order.order.cancelled.v1", str(billing[3], billing[2], billing[1]))
	// The source filter, which the store cannot apply, across pages.
	check("/dashboard/messages?consumer=billing&source=billing-0.events", str(billing[2], billing[0]))
	check("/dashboard/messages?source=nowhere", nil)
	check("/dashboard/messages?since=1h&consumer=billing&event=order.order.cancelled.v1", str(billing[3], billing[2], billing[1]))
	check("/dashboard/messages?since=2000-01-01&consumer=nobody", nil)
	if code, page := b.get(t, "/dashboard/messages?since=yesterday"); code != http.StatusBadRequest || !strings.Contains(page, "want an RFC 3339 time") {
		t.Errorf("bad since: %d\n%s", code, page)
	}
}

func TestRemoveNeedsConfirmationAndCSRF(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	id := b.park(t, idem.FailedMessage{Source: "stock.events", EventID: uuid.New(), EventName: "order.order.placed.v1", Body: []byte("{}")})
	path := fmt.Sprintf("/dashboard/messages/stock/%d/remove", id)

	// A POST without the token (no cookie, no form field): refused.
	if resp := b.post(t, path, nil); resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST without a token: %d, want 403", resp.StatusCode)
	}
	token := b.confirmToken(t, path)
	// A token that does not match the cookie: refused.
	if resp := b.post(t, path, url.Values{"csrf": {token + "x"}}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST with a wrong token: %d, want 403", resp.StatusCode)
	}
	// The right token from another site: refused.
	if resp := b.post(t, path, url.Values{"csrf": {token}}, "Sec-Fetch-Site", "cross-site"); resp.StatusCode != http.StatusForbidden {
		t.Errorf("cross-site POST: %d, want 403", resp.StatusCode)
	}
	if resp := b.post(t, path, url.Values{"csrf": {token}}, "Origin", "http://evil.example"); resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST from another origin: %d, want 403", resp.StatusCode)
	}
	// Another browser (another cookie) cannot use this one's token.
	other := setupClient(b)
	resp, err := other.PostForm(b.srv.URL+path, url.Values{"csrf": {token}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST with another browser's token: %d, want 403", resp.StatusCode)
	}
	if !b.exists(t, id) {
		t.Fatal("a refused POST removed the message")
	}
	// GET never acts.
	if code, _ := b.get(t, path); code != http.StatusOK || !b.exists(t, id) {
		t.Fatal("GET of the confirmation page removed the message")
	}
	resp = b.post(t, path, url.Values{"csrf": {token}}, "Origin", b.srv.URL)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("confirmed POST: %d, want 303", resp.StatusCode)
	}
	if loc := resp.Header.Get("Location"); !strings.Contains(loc, "notice=removed") {
		t.Errorf("redirect to %q", loc)
	}
	if b.exists(t, id) {
		t.Error("the message is still in the store")
	}
	logs := b.logs.String()
	for _, want := range []string{"dashboard: action refused", "CSRF token", "refused: cross-origin request", "dashboard: remove", "result=removed", fmt.Sprintf("id=%d", id), "user=anonymous", "remote=127.0.0.1"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the audit log lacks %q:\n%s", want, logs)
		}
	}
}

// setupClient returns a client with its own cookies.
func setupClient(b *bundle) *http.Client {
	jar, _ := cookiejar.New(nil)
	c := *b.client
	c.Jar = jar
	return &c
}

func TestReadOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *dashboard.Config) { c.ReadOnly = true })
	id := b.park(t, idem.FailedMessage{Source: "stock.events", EventID: uuid.New(), EventName: "order.order.placed.v1", Body: []byte("{}")})
	code, page := b.get(t, fmt.Sprintf("/dashboard/messages/stock/%d", id))
	if code != http.StatusOK {
		t.Fatalf("message page: %d", code)
	}
	if strings.Contains(page, `id="retry"`) || strings.Contains(page, `id="remove"`) || !strings.Contains(page, "read-only") {
		t.Errorf("read-only page shows actions:\n%s", page)
	}
	for _, action := range []string{"retry", "remove"} {
		path := fmt.Sprintf("/dashboard/messages/stock/%d/%s", id, action)
		if code, _ := b.get(t, path); code != http.StatusForbidden {
			t.Errorf("GET %s: %d, want 403", path, code)
		}
		if resp := b.post(t, path, url.Values{"csrf": {"x"}}); resp.StatusCode != http.StatusForbidden {
			t.Errorf("POST %s: %d, want 403", path, resp.StatusCode)
		}
	}
	if !b.exists(t, id) {
		t.Error("read-only mode removed a message")
	}
}

func TestAuthentication(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *dashboard.Config) {
		c.Token = "s3cret"
		c.BasicAuth = &dashboard.BasicAuth{User: "ops", Password: "pa55"}
	})
	for _, tc := range []struct {
		name   string
		header []string
		basic  []string
		want   int
	}{
		{"none", nil, nil, http.StatusUnauthorized},
		{"bearer", []string{"Authorization", "Bearer s3cret"}, nil, http.StatusOK},
		{"wrong bearer", []string{"Authorization", "Bearer nope"}, nil, http.StatusUnauthorized},
		{"token as password", nil, []string{"anyone", "s3cret"}, http.StatusOK},
		{"basic", nil, []string{"ops", "pa55"}, http.StatusOK},
		{"wrong password", nil, []string{"ops", "nope"}, http.StatusUnauthorized},
	} {
		req, _ := http.NewRequest("GET", b.srv.URL+"/dashboard/messages", nil)
		if tc.header != nil {
			req.Header.Set(tc.header[0], tc.header[1])
		}
		if tc.basic != nil {
			req.SetBasicAuth(tc.basic[0], tc.basic[1])
		}
		resp, err := b.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, resp.StatusCode, tc.want)
		}
		if resp.StatusCode == http.StatusUnauthorized && !strings.Contains(strings.Join(resp.Header.Values("WWW-Authenticate"), ","), "Basic") {
			t.Errorf("%s: 401 without a Basic challenge", tc.name)
		}
	}
	// Static files too.
	resp, err := b.client.Get(b.srv.URL + "/dashboard/static/style.css")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("style sheet without credentials: %d, want 401", resp.StatusCode)
	}
}

// failingRedeliverer stands for a transport whose Redeliver fails: the
// page must say so and keep the message. (The transports themselves are
// tested by broker/brokertest; the re-drive through a real broker and
// consumer by cmd/shop's browser test.)
type failingRedeliverer struct{}

func (failingRedeliverer) Redeliver(context.Context, string, []idem.Message) error {
	return errors.New("broker away")
}

func TestRetryWithoutBrokerOrSource(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	id := b.park(t, idem.FailedMessage{Source: "stock.events", EventID: uuid.New(), EventName: "order.order.placed.v1", Body: []byte("{}")})
	path := fmt.Sprintf("/dashboard/messages/stock/%d/retry", id)
	code, page := b.get(t, path)
	if code != http.StatusConflict || !strings.Contains(page, "idem dashboard --broker URL") || strings.Contains(page, `name="csrf"`) {
		t.Errorf("retry without a broker: %d\n%s", code, page)
	}

	b2 := setup(t, func(c *dashboard.Config) { c.Redeliverer = failingRedeliverer{} })
	noSource := b2.park(t, idem.FailedMessage{EventID: uuid.New(), Body: []byte("{}")})
	if code, page := b2.get(t, fmt.Sprintf("/dashboard/messages/stock/%d/retry", noSource)); code != http.StatusConflict || !strings.Contains(page, "queue this message came from is unknown") {
		t.Errorf("retry without a source: %d\n%s", code, page)
	}
	id2 := b2.park(t, idem.FailedMessage{Source: "stock.events", EventID: uuid.New(), Body: []byte("{}")})
	path = fmt.Sprintf("/dashboard/messages/stock/%d/retry", id2)
	token := b2.confirmToken(t, path)
	if resp := b2.post(t, path, url.Values{"csrf": {token}}); resp.StatusCode != http.StatusBadGateway {
		t.Errorf("retry through a failing broker: %d, want 502", resp.StatusCode)
	}
	if !b2.exists(t, id2) {
		t.Error("a failed retry removed the message")
	}
	if logs := b2.logs.String(); !strings.Contains(logs, "dashboard: retry") || !strings.Contains(logs, "broker away") {
		t.Errorf("the audit log lacks the failed retry:\n%s", logs)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	src := monitor.New(pg.Driver, monitor.Options{})
	for _, tc := range []struct {
		cfg  dashboard.Config
		want string
	}{
		{dashboard.Config{}, "Databases is empty"},
		{dashboard.Config{Databases: []dashboard.Database{{Store: pg.Driver, Source: src}}}, "Databases[0].Name is empty"},
		{dashboard.Config{Databases: []dashboard.Database{{Name: "a", Store: pg.Driver, Source: src}, {Name: "a", Store: pg.Driver, Source: src}}}, "used twice"},
		{dashboard.Config{Databases: []dashboard.Database{{Name: "a", Source: src}}}, "Store"},
		{dashboard.Config{Databases: []dashboard.Database{{Name: "a", Store: pg.Driver}}}, "Source"},
		{dashboard.Config{Databases: []dashboard.Database{{Name: "a", Store: pg.Driver, Source: src}}, BasicAuth: &dashboard.BasicAuth{User: "u"}}, "BasicAuth"},
		{dashboard.Config{Databases: []dashboard.Database{{Name: "a", Store: pg.Driver, Source: src}}, Path: "/a b/"}, "Path"},
	} {
		if _, err := dashboard.New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v): %v, want an error naming %q", tc.cfg, err, tc.want)
		}
	}
}

func TestNotFoundAndMethods(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	if code, _ := b.get(t, "/dashboard/nowhere"); code != http.StatusNotFound {
		t.Errorf("unknown page: %d", code)
	}
	if resp := b.post(t, "/dashboard/", nil); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST on the overview: %d", resp.StatusCode)
	}
	code, css := b.get(t, "/dashboard/static/style.css")
	if code != http.StatusOK || !strings.Contains(css, "polyline") {
		t.Errorf("style sheet: %d", code)
	}
}

// The dashboard, a public package, does not import net/http/pprof, whose
// init serves the profiles (and the command line) on
// http.DefaultServeMux of every program that imports it.
func TestNoProfilesOnDefaultServeMux(t *testing.T) {
	t.Parallel()
	r, _ := http.NewRequest(http.MethodGet, "http://x/debug/pprof/cmdline", nil)
	if _, pattern := http.DefaultServeMux.Handler(r); pattern != "" {
		t.Errorf("http.DefaultServeMux serves %s: something the dashboard imports registers the Go profiles", pattern)
	}
}
