package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idem-go/idem/internal/registry"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/internal/tools/shopkit"
)

// chromiumEnv names the headless browser the dashboard's test drives;
// scripts/test.sh installs Debian's chromium and sets it.
const chromiumEnv = "IDEM_TEST_CHROMIUM"

// screenshotsEnv, when set, is the directory the browser test saves its
// screenshots in (default: the test's temporary directory).
const screenshotsEnv = "IDEM_TEST_SCREENSHOTS"

// TestDashboardInBrowser runs the shop on PostgreSQL + RabbitMQ and the
// dashboard over its databases, and drives headless Chromium through it:
// the figures change after orders; a message the stock consumer parks
// (its database refuses the order's product) is shown, then retried from
// the page once the cause is gone, and applied exactly once; a POST
// without the CSRF token is refused; the read-only dashboard has no
// buttons.
func TestDashboardInBrowser(t *testing.T) {
	t.Parallel()
	chromium := os.Getenv(chromiumEnv)
	if chromium == "" {
		t.Fatalf("%s is not set: run the tests with make test (scripts/test.sh installs Debian's chromium and sets it), or set it to a Chromium binary", chromiumEnv)
	}
	if _, err := os.Stat(chromium); err != nil {
		t.Fatalf("%s=%s: %v (apt-get install chromium)", chromiumEnv, chromium, err)
	}
	shots := os.Getenv(screenshotsEnv)
	if shots == "" {
		shots = t.TempDir()
	} else if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := testsvc.Ctx(t, 5*time.Minute)
	pg, amqpURL := testdb.PostgresURL(t), testamqp.URL(t)
	ns := "dash_" + shopkit.RandomSuffix()
	in, err := shopkit.OpenInspector(ctx, pg, ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.DropNamespace(); in.Close() })
	admin, err := shopkit.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	cl := &shopkit.Cluster{Binary: shopBinary, DB: pg, Broker: amqpURL, Namespace: ns, LogDir: t.TempDir(),
		ExtraEnv: []string{"SHOP_ADMIN_ADDR=" + admin}}
	t.Cleanup(cl.StopAll)
	shop, err := cl.Start(ctx, shopkit.ProcSpec{Name: "shop", Services: "all"})
	if err != nil {
		t.Fatal(err)
	}

	if out := shop.Stdout(); !strings.Contains(out, "http://"+admin+dashboardPath) {
		t.Errorf("the banner does not give the dashboard's address:\n%s", out)
	}

	// The dashboard over the shop's databases, as the shop mounts it, in
	// the test's process: its samples come every second, for the charts
	// of the picture, and its audit lines are the test's to read. The
	// shop's own, on its admin address, is checked at the end.
	pub, err := registry.OpenPrefixed(ctx, amqpURL, ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	audit := &shopkit.LockedBuffer{}
	d, err := shopDashboard(in.DBs, pub, slog.New(slog.NewTextHandler(audit, nil)), dashboardOptions{Sample: time.Second, History: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Stop(context.Background()) })
	mux := http.NewServeMux()
	mux.Handle(dashboardPath, d)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	base := srv.URL + dashboardPath

	browser := newBrowser(t, ctx, chromium)
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(browser, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// figure reads a figure of the overview, loaded afresh.
	figure := func(sel string) string {
		t.Helper()
		if err := chromedp.Do(browser, chromedp.Navigate(base)); err != nil {
			t.Fatalf("overview: %v", err)
		}
		s, err := chromedp.Run(browser, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("overview, %s: %v", sel, err)
		}
		return strings.TrimSpace(s)
	}
	const stockProcessed = `tr[data-consumer="stock"] [data-figure="processed"]`
	if got := figure(stockProcessed); got != "0" {
		t.Errorf("stock processed %q before any order, want 0", got)
	}
	if got := figure(`#db-order [data-figure="last-published"]`); got != "never" {
		t.Errorf("order's last publish %q before any order, want never", got)
	}

	// Orders: the figures move.
	for i := range 3 {
		if _, err := shopkit.PlaceOK(ctx, shop.HTTP, fmt.Sprintf("c-%d", i), 2); err != nil {
			t.Fatal(err)
		}
	}
	testsvc.WaitFor(t, time.Minute, "stock processed 3 on the overview", func() bool {
		n, _ := strconv.Atoi(figure(stockProcessed))
		return n >= 3
	})
	if got := figure(`#db-order [data-figure="last-published"]`); got == "never" {
		t.Error("the order outbox's last publish is still never after three orders")
	}
	// Ten seconds of samples in the charts, then the picture for the
	// README.
	testsvc.WaitFor(t, time.Minute, "lines in the stock charts", func() bool {
		if err := chromedp.Do(browser, chromedp.Navigate(base)); err != nil {
			t.Fatal(err)
		}
		// The processed-per-minute line of stock, ten seconds long.
		n, err := chromedp.Run(browser, chromedp.Evaluate[int](`Math.min(...Array.from(document.querySelectorAll('#db-stock polyline')).map(p => p.points.numberOfItems))`))
		return err == nil && n >= 10
	})
	shot("overview")

	// The stock database refuses a product: the consumer retries, then
	// parks the message.
	stock := in.DBs["stock"].SQL
	mustExec(t, stock, `CREATE FUNCTION refuse_blocked() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'product % is blocked by the warehouse', NEW.product_id; END $$`)
	mustExec(t, stock, `CREATE TRIGGER refuse_blocked BEFORE INSERT ON reservation FOR EACH ROW
WHEN (NEW.product_id = 'p-blocked') EXECUTE FUNCTION refuse_blocked()`)
	orderID := placeProduct(t, ctx, shop.HTTP, "p-blocked")
	var parkedID int64
	testsvc.WaitFor(t, time.Minute, "the stock consumer to park the order", func() bool {
		err := stock.QueryRowContext(ctx, `SELECT id FROM failed_message WHERE consumer_name = 'stock'`).Scan(&parkedID)
		return err == nil
	})
	if got := figure(`tr[data-consumer="stock"] [data-figure="parked"]`); got != "1" {
		t.Errorf("stock parked %q on the overview, want 1", got)
	}

	// The list, filtered by consumer, then the message.
	err = chromedp.Do(browser,
		chromedp.Navigate(base+"messages?db=stock&consumer=stock"),
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-id="%d"] a`, parkedID))),
		chromedp.WaitVisible(chromedp.CSS(`#body`)),
	)
	if err != nil {
		t.Fatal(err)
	}
	body := text(t, browser, `#body`)
	errText := text(t, browser, `dd.err`)
	if !strings.Contains(body, orderID) || !strings.Contains(body, "p-blocked") || !strings.Contains(errText, "blocked by the warehouse") {
		t.Errorf("message page: body %q, error %q", body, errText)
	}
	shot("message")

	// A POST without the CSRF token is refused, and changes nothing.
	resp, err := http.PostForm(fmt.Sprintf("%smessages/stock/%d/retry", base, parkedID), url.Values{})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST without a CSRF token: %d, want 403", resp.StatusCode)
	}

	// The cause goes; retry from the page, confirmed.
	mustExec(t, stock, `DROP TRIGGER refuse_blocked ON reservation`)
	err = chromedp.Do(browser,
		chromedp.Click(chromedp.CSS(`#retry`)),
		chromedp.WaitVisible(chromedp.CSS(`#confirm`)),
	)
	if err != nil {
		t.Fatal(err)
	}
	shot("confirm")
	if err := chromedp.Do(browser, chromedp.Click(chromedp.CSS(`#confirm`))); err != nil {
		t.Fatal(err)
	}
	// The message's page with a notice, or an error page that says why.
	var landed string
	testsvc.WaitFor(t, time.Minute, "the page after the confirmed retry", func() bool {
		s, err := chromedp.Run(browser, chromedp.Evaluate[string](`(document.querySelector('.notice, #error') || {}).className || (document.querySelector('#error') ? 'error' : '')`))
		if err == nil && s == "" {
			if loc, err := chromedp.Run(browser, chromedp.Location()); err == nil {
				landed = loc
			}
		}
		return err == nil && s != ""
	})
	if n, _ := chromedp.Run(browser, chromedp.Evaluate[int](`document.querySelectorAll('#error').length`)); n > 0 {
		loc, _ := chromedp.Run(browser, chromedp.Location())
		t.Fatalf("the confirmed retry ended on %s: %s (last page before: %s)", loc, text(t, browser, `#error`), landed)
	}
	notice := text(t, browser, `.notice`)
	if !strings.Contains(notice, "sent back to its queue") {
		t.Errorf("notice after retry: %q", notice)
	}
	testsvc.WaitFor(t, time.Minute, "the retried message to be applied", func() bool {
		var n int
		err := stock.QueryRowContext(ctx, `SELECT count(*) FROM failed_message`).Scan(&n)
		return err == nil && n == 0
	})
	var reservations, markers int
	if err := stock.QueryRowContext(ctx, `SELECT count(*) FROM reservation WHERE order_id = $1`, orderID).Scan(&reservations); err != nil {
		t.Fatal(err)
	}
	if reservations != 1 {
		t.Errorf("order %s has %d reservations after the retry, want 1", orderID, reservations)
	}
	if err := stock.QueryRowContext(ctx, `SELECT count(*) FROM processed_event WHERE consumer_name = 'stock'`).Scan(&markers); err != nil {
		t.Fatal(err)
	}
	if markers != 4 {
		t.Errorf("%d stock markers, want 4 (three orders, then the retried one once)", markers)
	}
	if a := audit.String(); !strings.Contains(a, "dashboard: retry") || !strings.Contains(a, "result=sent") || !strings.Contains(a, fmt.Sprintf("id=%d", parkedID)) {
		t.Errorf("no audit line for the retry:\n%s", a)
	}
	if err := chromedp.Do(browser, chromedp.Navigate(base+"messages?db=stock"), chromedp.WaitVisible(chromedp.CSS(`#empty`))); err != nil {
		t.Errorf("the list still shows parked messages: %v", err)
	}

	// Read-only: the same message page without a button.
	mustExec(t, stock, `INSERT INTO failed_message (consumer_name, source, body, error, attempts, first_failed_at, failed_at)
VALUES ('stock', 'stock.events', decode('00016e6f74206a736f6e', 'hex'), 'undecodable', 1, now(), now())`)
	var binaryID int64
	if err := stock.QueryRowContext(ctx, `SELECT id FROM failed_message`).Scan(&binaryID); err != nil {
		t.Fatal(err)
	}
	ro, err := shopDashboard(in.DBs, pub, slog.New(slog.NewTextHandler(audit, nil)), dashboardOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	roMux := http.NewServeMux()
	roMux.Handle(dashboardPath, ro)
	roSrv := httptest.NewServer(roMux)
	t.Cleanup(roSrv.Close)
	err = chromedp.Do(browser,
		chromedp.Navigate(fmt.Sprintf("%s%smessages/stock/%d", roSrv.URL, dashboardPath, binaryID)),
		chromedp.WaitVisible(chromedp.CSS(`#body`)),
	)
	if err != nil {
		t.Fatal(err)
	}
	buttons, err := chromedp.Run(browser, chromedp.Evaluate[int](`document.querySelectorAll('#retry, #remove, form').length`))
	if err != nil {
		t.Fatal(err)
	}
	hex := text(t, browser, `#body`)
	if buttons != 0 {
		t.Errorf("the read-only page has %d buttons or forms", buttons)
	}
	if !strings.Contains(hex, "00 01 6e 6f 74") {
		t.Errorf("binary body not shown as a hex dump: %q", hex)
	}
	shot("read-only")

	// The shop's own dashboard, on its admin address: the same figures,
	// and the commit-to-handle quantiles from the shop's metrics.
	const stockDelay = `tr[data-consumer="stock"] [data-figure="delay"]`
	testsvc.WaitFor(t, time.Minute, "the shop's dashboard to show stock's commit-to-handle delay", func() bool {
		if err := chromedp.Do(browser, chromedp.Navigate("http://"+admin+dashboardPath)); err != nil {
			t.Fatal(err)
		}
		s, err := chromedp.Run(browser, chromedp.Text(chromedp.CSS(stockDelay)))
		return err == nil && !strings.Contains(s, "–")
	})
	if got := text(t, browser, stockProcessed); got == "0" {
		t.Errorf("the shop's dashboard shows stock processed %s", got)
	}
	t.Logf("screenshots in %s", shots)
}

// newBrowser starts headless Chromium for the test and returns its
// context; the browser is closed at cleanup.
func newBrowser(t *testing.T, ctx context.Context, path string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox, // tests run as root
		chromedp.DisableGPU,
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1400, 1000),
		chromedp.UserDataDir(t.TempDir()),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	browser, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(browser); err != nil {
		t.Fatalf("start %s: %v", path, err)
	}
	return browser
}

// text returns the text of the element sel of the browser's page.
func text(t *testing.T, browser context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(browser, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return s
}

func mustExec(t *testing.T, db *sql.DB, query string, args ...any) {
	t.Helper()
	if _, err := db.Exec(query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// placeProduct places an order of one product and returns its id.
func placeProduct(t *testing.T, ctx context.Context, addr, product string) string {
	t.Helper()
	raw, _ := json.Marshal(map[string]any{"customer_id": "c-blocked",
		"lines": []map[string]string{{"product_id": product, "quantity": "1.000"}}})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/orders", bytes.NewReader(raw))
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var o struct{ ID string }
	if err := json.NewDecoder(resp.Body).Decode(&o); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /orders: %d %v", resp.StatusCode, err)
	}
	return o.ID
}

// TestAdminBeyondLoopbackReadOnly: an --admin-addr reachable beyond this
// machine without a token is refused, unless --insecure-no-auth says that
// something in front authenticates: then the shop warns, and its dashboard
// shows parked messages but offers no retry or remove.
func TestAdminBeyondLoopbackReadOnly(t *testing.T) {
	t.Parallel()
	local, err := shopkit.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := strings.Cut(local, ":")
	ctx := context.Background()
	refused := &shopkit.Cluster{Binary: shopBinary, DataDir: t.TempDir(), LogDir: t.TempDir(), ExtraEnv: []string{"SHOP_ADMIN_ADDR=0.0.0.0:" + port}}
	t.Cleanup(refused.StopAll)
	p, err := refused.Start(ctx, shopkit.ProcSpec{Name: "shop", Services: "all"})
	if !errors.Is(err, shopkit.ErrExitedAtStart) || !strings.Contains(p.Tail(), "--admin-addr 0.0.0.0:"+port+" listens beyond loopback without authentication") ||
		!strings.Contains(p.Tail(), "--insecure-no-auth") {
		t.Fatalf("shop --admin-addr 0.0.0.0:%s without a token: %v, want a refusal naming --insecure-no-auth", port, err)
	}

	cl := &shopkit.Cluster{Binary: shopBinary, DataDir: t.TempDir(), LogDir: t.TempDir(), ExtraEnv: []string{"SHOP_ADMIN_ADDR=0.0.0.0:" + port, "SHOP_INSECURE_NO_AUTH=true"}}
	t.Cleanup(cl.StopAll)
	p, err = cl.Start(ctx, shopkit.ProcSpec{Name: "shop", Services: "all"})
	if err != nil {
		t.Fatal(err)
	}
	if out := p.Tail(); !strings.Contains(out, "without authentication (--insecure-no-auth)") || !strings.Contains(out, "read-only there") {
		t.Errorf("no warning about the admin address:\n%s", out)
	}
	code, page, err := adminGet(ctx, "http://127.0.0.1:"+port+"/dashboard/")
	if err != nil || code != http.StatusOK || !strings.Contains(page, "read-only") {
		t.Fatalf("dashboard: %d %v\n%s", code, err, page)
	}
}
