package dashboard_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/dashboard"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
)

// chromiumEnv names the headless browser the browser tests drive;
// scripts/test.sh installs Debian's chromium and sets it.
const chromiumEnv = "IDEM_TEST_CHROMIUM"

// screenshotsEnv, when set, is the directory the browser test saves its
// screenshots in.
const screenshotsEnv = "IDEM_TEST_SCREENSHOTS"

// TestGroupsInBrowser drives headless Chromium through the groups of the
// list page: "Retry all…" of a group, confirmed, re-drives its messages to
// the consumer, which applies them; the page then says so and shows the
// other group only. The read-only dashboard shows the groups without
// actions.
func TestGroupsInBrowser(t *testing.T) {
	t.Parallel()
	chromium := os.Getenv(chromiumEnv)
	if chromium == "" {
		t.Fatalf("%s is not set: run the tests with make test (scripts/test.sh installs Debian's chromium and sets it), or set it to a Chromium binary", chromiumEnv)
	}
	pg := testdb.NewPostgres(t)
	pg.Exec(t, `CREATE TABLE reservation (event_id uuid PRIMARY KEY)`)
	db := postgres.NewSQL(pg.DB)
	c, err := inbox.New[*sql.Tx](db, inbox.Config{Name: "stock"})
	if err != nil {
		t.Fatal(err)
	}
	c.Handle(inbox.AnyEvent, func(ctx context.Context, tx *sql.Tx, ev idem.Event) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO reservation VALUES ($1)`, ev.ID)
		return err
	})
	rd := &consumerRedeliverer{c: c}
	b := setupWith(t, db, func(cfg *dashboard.Config) { cfg.Redeliverer = rd })
	var qty []idem.FailedMessage
	for i := range 3 {
		qty = append(qty, parkEvent(t, b.store, "stock", fmt.Sprint("q", i), fmt.Sprintf(`idem: handling order.order.placed.v1 %%s: permanent: field "qty" is -%d`, i+1)))
	}
	other := parkEvent(t, b.store, "stock", "p0", `idem: handling order.order.placed.v1 %s: permanent: unknown product`)
	qtyID, _, _ := inbox.GroupOf(qty[0])
	otherID, _, _ := inbox.GroupOf(other)

	browser := newBrowser(t, chromium)
	shot := func(name string) {
		t.Helper()
		dir := os.Getenv(screenshotsEnv)
		if dir == "" {
			return
		}
		png, err := chromedp.Run(browser, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	base := b.srv.URL + "/dashboard/"
	count := func(sel string) int {
		t.Helper()
		n, err := chromedp.Run(browser, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, sel)))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	err = chromedp.Do(browser,
		chromedp.Navigate(base+"messages?db=stock&consumer=stock"),
		chromedp.WaitVisible(chromedp.CSS(`#groups`)),
	)
	if err != nil {
		t.Fatal(err)
	}
	if got := text(t, browser, fmt.Sprintf(`tr[data-group="%s"] [data-figure="count"]`, qtyID)); got != "3" {
		t.Errorf("the qty group counts %q messages, want 3", got)
	}
	shot("groups")
	if n := count(`#retry-all, #remove-all`); n != 2 {
		t.Errorf("%d bulk buttons for the consumer, want 2", n)
	}
	err = chromedp.Do(browser,
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-group="%s"] a[data-action="retry"]`, qtyID))),
		chromedp.WaitVisible(chromedp.CSS(`#confirm`)),
	)
	if err != nil {
		t.Fatal(err)
	}
	shot("groups-confirm")
	if got := text(t, browser, `#count`); got != "3" {
		t.Errorf("the confirmation counts %q messages, want 3", got)
	}
	err = chromedp.Do(browser,
		chromedp.Click(chromedp.CSS(`#confirm`)),
		chromedp.WaitVisible(chromedp.CSS(`.notice`)),
	)
	if err != nil {
		t.Fatalf("after the confirmed retry: %v (page: %s)", err, text(t, browser, `main`))
	}
	if notice := text(t, browser, `.notice`); !strings.Contains(notice, "3 message(s) were sent back") {
		t.Errorf("notice %q", notice)
	}
	if count(fmt.Sprintf(`tr[data-group="%s"]`, qtyID)) != 0 || count(fmt.Sprintf(`tr[data-group="%s"]`, otherID)) != 1 {
		t.Errorf("after the retry, the list shows the groups %s", text(t, browser, `#groups`))
	}
	if n := pg.Count(t, "reservation"); n != 3 {
		t.Errorf("%d reservations after retry all, want the group's 3", n)
	}

	ro := setupWith(t, db, func(cfg *dashboard.Config) { cfg.ReadOnly = true })
	err = chromedp.Do(browser,
		chromedp.Navigate(ro.srv.URL+"/dashboard/messages?db=stock&consumer=stock"),
		chromedp.WaitVisible(chromedp.CSS(`#groups`)),
	)
	if err != nil {
		t.Fatal(err)
	}
	if n := count(`a[data-action], #retry-all, #remove-all, form[method=post]`); n != 0 {
		t.Errorf("the read-only list has %d actions", n)
	}
}

// newBrowser starts headless Chromium for the test and returns its
// context; the browser is closed at cleanup.
func newBrowser(t *testing.T, path string) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
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
	browser, cancelBrowser := chromedp.NewContext(allocCtx)
	t.Cleanup(func() { cancelBrowser(); cancelAlloc() })
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
	return strings.TrimSpace(s)
}
