package dashboard_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/dashboard"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
)

// consumerRedeliverer sends re-driven messages straight to a consumer, as
// a broker would deliver them from the queue they are sent back to: when
// Redeliver returns, the consumer has handled them.
type consumerRedeliverer struct {
	c    *inbox.Consumer[*sql.Tx]
	mu   sync.Mutex
	sent []uuid.UUID
}

func (r *consumerRedeliverer) Redeliver(ctx context.Context, source string, msgs []idem.Message) error {
	ds := make([]inbox.Delivery, len(msgs))
	for i, m := range msgs {
		ds[i] = inbox.Delivery{Message: m, Source: source, Attempt: 1}
		r.mu.Lock()
		r.sent = append(r.sent, m.EventID)
		r.mu.Unlock()
	}
	_, errs := r.c.DeliverBatch(ctx, ds)
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (r *consumerRedeliverer) sentIDs() []uuid.UUID {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.sent)
}

// groupDB is a database of one dialect for the group tests.
type groupDB struct {
	db      driver.Driver[*sql.Tx]
	sql     *sql.DB
	dialect string
}

func forEachDialect(t *testing.T, test func(t *testing.T, g groupDB)) {
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		pg := testdb.NewPostgres(t)
		test(t, groupDB{db: postgres.NewSQL(pg.DB), sql: pg.DB, dialect: "postgres"})
	})
	t.Run("mariadb", func(t *testing.T) {
		t.Parallel()
		m := testdb.NewMariaDB(t)
		test(t, groupDB{db: m.Driver, sql: m.DB, dialect: "mysql"})
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		s := testdb.NewSQLite(t)
		test(t, groupDB{db: s.Driver, sql: s.DB, dialect: "sqlite"})
	})
}

// parkEvent parks a decodable message of consumer, whose error is errText
// with its event id, and returns it as stored.
func parkEvent(t *testing.T, store *inbox.FailureStore, consumer, aggregate, errText string) idem.FailedMessage {
	t.Helper()
	ev, err := idem.NewEvent("order.order.placed.v1", "order", aggregate, map[string]string{"customer": aggregate})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := idem.NewMessage(ev)
	if err != nil {
		t.Fatal(err)
	}
	m := idem.FailedMessage{Consumer: consumer, Source: consumer + ".events", EventID: ev.ID, EventName: ev.Name, AggregateType: "order",
		AggregateID: aggregate, Key: msg.Key, Headers: msg.Headers, Body: msg.Body, Error: fmt.Sprintf(errText, ev.ID), Attempts: 1}
	if m.ID, err = store.Save(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	return m
}

var groupRowRE = regexp.MustCompile(`(?s)<tr data-group="([0-9a-f]+)">.*?data-figure="count">(\d+)<`)

// pageGroups returns the groups of the messages page and their counts.
func pageGroups(page string) map[string]string {
	out := map[string]string{}
	for _, m := range groupRowRE.FindAllStringSubmatch(page, -1) {
		out[m[1]] = m[2]
	}
	return out
}

// TestGroupActions, on every dialect: the list shows the parked messages
// in groups (messages that differ by ids and numbers together, other
// causes apart); "retry all" of a group re-drives exactly its messages,
// which the consumer applies; "remove all" of a group, and of a consumer,
// removes exactly theirs; both need the confirmation form's CSRF token.
func TestGroupActions(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, g groupDB) {
		ctx := context.Background()
		if _, err := g.sql.ExecContext(ctx, `CREATE TABLE reservation (event_id VARCHAR(36) PRIMARY KEY)`); err != nil {
			t.Fatal(err)
		}
		insert := "INSERT INTO reservation (event_id) VALUES (?)"
		if g.dialect == "postgres" {
			insert = "INSERT INTO reservation (event_id) VALUES ($1)"
		}
		c, err := inbox.New[*sql.Tx](g.db, inbox.Config{Name: "stock"})
		if err != nil {
			t.Fatal(err)
		}
		c.Handle(inbox.AnyEvent, func(ctx context.Context, tx *sql.Tx, ev idem.Event) error {
			_, err := tx.ExecContext(ctx, insert, ev.ID.String())
			return err
		})
		rd := &consumerRedeliverer{c: c}
		b := setupWith(t, g.db, func(cfg *dashboard.Config) { cfg.Redeliverer = rd })

		const qty = `idem: handling order.order.placed.v1 %s: permanent: field "qty" is -%d`
		var qtyGroup, productGroup []idem.FailedMessage
		for i := range 3 {
			qtyGroup = append(qtyGroup, parkEvent(t, b.store, "stock", fmt.Sprint("q", i), strings.Replace(qty, "%d", fmt.Sprint(3+4*i), 1)))
		}
		for i := range 2 {
			productGroup = append(productGroup, parkEvent(t, b.store, "stock", fmt.Sprint("p", i), `idem: handling order.order.placed.v1 %s: permanent: unknown product`))
		}
		billing := parkEvent(t, b.store, "billing", "b0", strings.Replace(qty, "%d", "3", 1))
		qtyID, _, _ := inbox.GroupOf(qtyGroup[0])
		productID, _, _ := inbox.GroupOf(productGroup[0])
		billingID, _, _ := inbox.GroupOf(billing)

		code, page := b.get(t, "/dashboard/messages?db=stock")
		if code != http.StatusOK {
			t.Fatalf("messages: %d\n%s", code, page)
		}
		if got, want := pageGroups(page), map[string]string{qtyID: "3", productID: "2", billingID: "1"}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("groups on the page %v, want %v\n%s", got, want, page)
		}
		if !strings.Contains(page, "field &lt;q&gt; is &lt;n&gt;") || !strings.Contains(page, fmt.Sprintf(`href="/dashboard/bulk/stock/retry?group=%s"`, qtyID)) {
			t.Errorf("the groups lack their cause or their actions:\n%s", page)
		}

		// Without the confirmation form's token: refused, nothing sent.
		path := "/dashboard/bulk/stock/retry"
		if resp := b.post(t, path, url.Values{"group": {qtyID}}); resp.StatusCode != http.StatusForbidden {
			t.Errorf("POST retry all without a token: %d, want 403", resp.StatusCode)
		}
		if sent := rd.sentIDs(); len(sent) != 0 {
			t.Fatalf("a refused POST sent %v", sent)
		}
		code, confirm := b.get(t, path+"?group="+qtyID)
		if code != http.StatusOK || !strings.Contains(confirm, "Retry 3 message(s)") || !strings.Contains(confirm, `name="group" value="`+qtyID+`"`) {
			t.Fatalf("confirmation of retry all: %d\n%s", code, confirm)
		}
		token := csrfRE.FindStringSubmatch(confirm)[1]
		resp := b.post(t, path, url.Values{"csrf": {token}, "group": {qtyID}})
		if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || !strings.Contains(loc, "notice=retried-all") || !strings.Contains(loc, "n=3") {
			t.Fatalf("confirmed retry all: %d to %q\n%s", resp.StatusCode, loc, b.logs.String())
		}
		want := []uuid.UUID{qtyGroup[0].EventID, qtyGroup[1].EventID, qtyGroup[2].EventID}
		if sent := rd.sentIDs(); !slices.Equal(sent, want) {
			t.Errorf("re-driven %v, want the group's messages, oldest first: %v", sent, want)
		}
		for _, m := range qtyGroup {
			if b.exists(t, m.ID) {
				t.Errorf("message %d, retried and applied, is still stored", m.ID)
			}
			var n int
			q := strings.Replace("SELECT count(*) FROM reservation WHERE event_id = ?", "?", map[bool]string{true: "$1", false: "?"}[g.dialect == "postgres"], 1)
			if err := g.sql.QueryRowContext(ctx, q, m.EventID.String()).Scan(&n); err != nil || n != 1 {
				t.Errorf("event %s applied %d times (%v), want once", m.EventID, n, err)
			}
		}
		for _, m := range append(slices.Clone(productGroup), billing) {
			if !b.exists(t, m.ID) {
				t.Errorf("message %d of another group is gone", m.ID)
			}
		}
		if code, page := b.get(t, "/dashboard/messages?db=stock&notice=retried-all&n=3"); code != http.StatusOK || !strings.Contains(page, "3 message(s) were sent back") {
			t.Errorf("the list after retry all: %d, no notice", code)
		}

		// Remove all of consumer billing, then the product group.
		code, confirm = b.get(t, "/dashboard/bulk/stock/remove?consumer=billing")
		if code != http.StatusOK || !strings.Contains(confirm, "Remove 1 message(s)") {
			t.Fatalf("confirmation of remove all of billing: %d\n%s", code, confirm)
		}
		token = csrfRE.FindStringSubmatch(confirm)[1]
		if resp := b.post(t, "/dashboard/bulk/stock/remove", url.Values{"csrf": {token}, "consumer": {"billing"}}); resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("confirmed remove all of billing: %d", resp.StatusCode)
		}
		if b.exists(t, billing.ID) || !b.exists(t, productGroup[0].ID) || !b.exists(t, productGroup[1].ID) {
			t.Error("remove all of billing did not remove exactly billing's message")
		}
		token = b.confirmToken(t, "/dashboard/bulk/stock/remove?group="+productID)
		resp = b.post(t, "/dashboard/bulk/stock/remove", url.Values{"csrf": {token}, "group": {productID}})
		if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || !strings.Contains(loc, "notice=removed-all") || !strings.Contains(loc, "n=2") {
			t.Fatalf("confirmed remove of the group: %d to %q", resp.StatusCode, loc)
		}
		if left, err := b.store.List(ctx, idem.FailedFilter{}); err != nil || len(left) != 0 {
			t.Errorf("left in the store: %v %v", left, err)
		}
		if code, _ := b.get(t, "/dashboard/bulk/stock/remove?group="+productID); code != http.StatusNotFound {
			t.Errorf("confirmation of a group gone: %d, want 404", code)
		}

		// Retry all of consumer stock: its messages of every cause.
		late := []idem.FailedMessage{
			parkEvent(t, b.store, "stock", "l0", `idem: handling order.order.placed.v1 %s: warehouse locked`),
			parkEvent(t, b.store, "stock", "l1", `idem: undecodable message: payload: %s is not an object`),
		}
		lateID, _, _ := inbox.GroupOf(late[0])
		_, page = b.get(t, "/dashboard/messages?db=stock&consumer=stock&event=order.order.placed.v1")
		for _, want := range []string{`id="retry-all" href="/dashboard/bulk/stock/retry?consumer=stock&amp;event=order.order.placed.v1"`,
			`href="/dashboard/bulk/stock/remove?group=` + lateID + `&amp;consumer=stock&amp;event=order.order.placed.v1"`} {
			if !strings.Contains(page, want) {
				t.Fatalf("the list of consumer stock lacks %s:\n%s", want, page)
			}
		}
		token = b.confirmToken(t, "/dashboard/bulk/stock/retry?consumer=stock")
		resp = b.post(t, "/dashboard/bulk/stock/retry", url.Values{"csrf": {token}, "consumer": {"stock"}})
		if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || !strings.Contains(loc, "n=2") {
			t.Fatalf("confirmed retry all of stock: %d to %q", resp.StatusCode, loc)
		}
		if sent := rd.sentIDs(); !slices.Equal(sent[3:], []uuid.UUID{late[0].EventID, late[1].EventID}) {
			t.Errorf("retry all of stock re-drove %v, want %v then %v", sent[3:], late[0].EventID, late[1].EventID)
		}
		for _, m := range late {
			if b.exists(t, m.ID) {
				t.Errorf("message %d, retried and applied, is still stored", m.ID)
			}
		}
		logs := b.logs.String()
		for _, want := range []string{`action="retry all"`, "group=" + qtyID, "found=3", `action="remove all"`, "consumer=billing", "removed=2"} {
			if !strings.Contains(logs, want) {
				t.Errorf("the audit log lacks %q:\n%s", want, logs)
			}
		}
	})
}

// TestGroupActionsReadOnly, on every dialect: the read-only dashboard
// shows the groups without actions, and refuses the actions' pages and
// POSTs.
func TestGroupActionsReadOnly(t *testing.T) {
	t.Parallel()
	forEachDialect(t, func(t *testing.T, g groupDB) {
		b := setupWith(t, g.db, func(c *dashboard.Config) { c.ReadOnly = true })
		m := parkEvent(t, b.store, "stock", "42", `idem: handling order.order.placed.v1 %s: permanent: unknown product`)
		id, _, _ := inbox.GroupOf(m)
		code, page := b.get(t, "/dashboard/messages?db=stock&consumer=stock")
		if code != http.StatusOK || pageGroups(page)[id] != "1" {
			t.Fatalf("read-only list: %d, want the group\n%s", code, page)
		}
		if strings.Contains(page, "/bulk/") || strings.Contains(page, `id="retry-all"`) || strings.Contains(page, "data-action") {
			t.Errorf("the read-only list offers actions:\n%s", page)
		}
		for _, action := range []string{"retry", "remove"} {
			for _, q := range []string{"group=" + id, "consumer=stock"} {
				path := "/dashboard/bulk/stock/" + action
				if code, _ := b.get(t, path+"?"+q); code != http.StatusForbidden {
					t.Errorf("GET %s?%s: %d, want 403", path, q, code)
				}
				form, _ := url.ParseQuery(q)
				form.Set("csrf", "x")
				if resp := b.post(t, path, form); resp.StatusCode != http.StatusForbidden {
					t.Errorf("POST %s %v: %d, want 403", path, form, resp.StatusCode)
				}
			}
		}
		if !b.exists(t, m.ID) {
			t.Error("the read-only dashboard removed a message")
		}
		if logs := b.logs.String(); !strings.Contains(logs, "refused: read-only") {
			t.Errorf("no audit line for the refused actions:\n%s", logs)
		}
	})
}
