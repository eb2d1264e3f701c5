package dashboard_test

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/dashboard"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/outbox"
)

// basicAuth adds a user's basic authentication to every request.
type basicAuth struct {
	next       http.RoundTripper
	user, pass string
}

func (a basicAuth) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.SetBasicAuth(a.user, a.pass)
	return a.next.RoundTrip(r)
}

// TestMessageOperations: signed in as alice, an operator edits a parked
// message's body and headers (the message as received stays on its page,
// the edit in its audit trail), sends another to another consumer (it
// reaches that consumer's queue, the entry is archived, a resolved notice
// is in the outbox), and archives the first (out of the list, in the
// archived list). A header line without a colon, and a body that is not
// text, are refused; without a publisher to one consumer, sending is
// disabled and says why.
func TestMessageOperations(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	pub := memory.New()
	pub.Declare("billing")
	b := setupWith(t, pg.Driver, func(c *dashboard.Config) {
		c.ConsumerPublisher = pub
		c.BasicAuth = &dashboard.BasicAuth{User: "alice", Password: "test-only-password"}
		c.Databases[0].FailureHook = outbox.FailureEvents(outbox.NewWriter(pg.Driver), outbox.FailureEventsConfig{})
	})
	b.pg = pg
	b.client.Transport = basicAuth{next: b.client.Transport, user: "alice", pass: "test-only-password"}
	received := []byte(`{"event_id":"1","payload":{"qty":-7}}`)
	edited := b.park(t, idem.FailedMessage{Source: "stock.events", EventID: uuid.New(), EventName: "order.order.placed.v1",
		AggregateType: "order", AggregateID: "42", Headers: map[string]string{"x-a": "1", "x-gone": "z"}, Body: received})
	sent := b.park(t, idem.FailedMessage{Source: "stock.events", EventID: uuid.New(), EventName: "order.order.placed.v1",
		AggregateType: "order", AggregateID: "43", Body: []byte(`{"event_id":"2"}`)})
	binary := b.park(t, idem.FailedMessage{Source: "stock.events", Body: []byte{0, 1, 0xff}, Error: "undecodable"})
	ctx := context.Background()
	page := func(id int64, suffix string) string { return fmt.Sprintf("/dashboard/messages/stock/%d%s", id, suffix) }

	if code, body := b.get(t, page(edited, "")); code != http.StatusOK || !strings.Contains(body, `id="edit"`) ||
		!strings.Contains(body, `id="redirect"`) || !strings.Contains(body, `id="archive"`) {
		t.Fatalf("message page: %d, want the edit, redirect and archive buttons\n%s", code, body)
	}

	// Edit: the form holds the message; a bad header line is refused.
	token := b.confirmToken(t, page(edited, "/edit"))
	if _, body := b.get(t, page(edited, "/edit")); !strings.Contains(body, "x-gone: z") || !strings.Contains(body, `&#34;qty&#34;:-7`) {
		t.Errorf("edit form without the message's headers and body:\n%s", body)
	}
	if resp := b.post(t, page(edited, "/edit"), url.Values{"csrf": {token}, "body": {"x"}, "headers": {"no colon"}}); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("edit with a header line without a colon: %d, want 400", resp.StatusCode)
	}
	fixed := `{"event_id":"1","payload":{"qty":7}}`
	resp := b.post(t, page(edited, "/edit"), url.Values{"csrf": {token}, "body": {fixed}, "headers": {"x-a: 2\r\nx-b: new\r\n"}})
	if resp.StatusCode != http.StatusSeeOther || !strings.Contains(resp.Header.Get("Location"), "notice=edited") {
		t.Fatalf("edit: %d to %q, want a redirect to the message", resp.StatusCode, resp.Header.Get("Location"))
	}
	m, err := b.store.Get(ctx, edited)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Body) != fixed || !maps.Equal(m.Headers, map[string]string{"x-a": "2", "x-b": "new"}) || m.Original == nil ||
		!bytes.Equal(m.Original.Body, received) || len(m.Actions) != 1 || m.Actions[0].Action != idem.FailedEdit || m.Actions[0].By != "alice" {
		t.Fatalf("edited entry: body %s, headers %v, original %+v, actions %+v", m.Body, m.Headers, m.Original, m.Actions)
	}
	code, body := b.get(t, page(edited, "?notice=edited&id="+fmt.Sprint(edited)))
	if code != http.StatusOK || !strings.Contains(body, "as edited") || !strings.Contains(body, `id="original-body"`) ||
		!strings.Contains(body, `&#34;qty&#34;:-7`) || !regexp.MustCompile(`<td>edit</td><td>alice</td>`).MatchString(body) ||
		!strings.Contains(body, "was edited") {
		t.Errorf("edited message page: %d\n%s", code, body)
	}
	if !strings.Contains(b.logs.String(), "action=edit") || !strings.Contains(b.logs.String(), "user=alice") {
		t.Errorf("no audit line of the edit:\n%s", b.logs.String())
	}
	if code, body := b.get(t, page(binary, "/edit")); code != http.StatusConflict || !strings.Contains(body, "idem failed edit") || strings.Contains(body, `name="csrf"`) {
		t.Errorf("edit form of a binary body: %d, want 409 and the command line's way\n%s", code, body)
	}

	// Send to another consumer: it reaches that consumer's queue only.
	token = b.confirmToken(t, page(sent, "/redirect"))
	resp = b.post(t, page(sent, "/redirect"), url.Values{"csrf": {token}, "consumer": {"billing"}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("redirect: %d, want 303", resp.StatusCode)
	}
	if n := pub.Pending("billing"); n != 1 {
		t.Errorf("billing's queue holds %d messages, want the one sent", n)
	}
	if m, err := b.store.Get(ctx, sent); err != nil || m.Archived.IsZero() || len(m.Actions) != 1 || m.Actions[0].Action != idem.FailedRedirect || m.Actions[0].By != "alice" {
		t.Errorf("redirected entry: %+v, %v; want archived, a redirect by alice", m, err)
	}
	if n := pg.Count(t, "outbox WHERE type = $1 AND payload->>'resolution' = 'redirected' AND payload->>'by' = 'alice'", idem.FailureMessageResolved); n != 1 {
		t.Errorf("resolved notices of the redirect: %d, want 1", n)
	}

	// Archive: out of the list, in the archived one.
	token = b.confirmToken(t, page(edited, "/archive"))
	if resp := b.post(t, page(edited, "/archive"), url.Values{"csrf": {token}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("archive: %d, want 303", resp.StatusCode)
	}
	ids := func(path string) string {
		t.Helper()
		code, body := b.get(t, path)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d\n%s", path, code, body)
		}
		return fmt.Sprint(regexp.MustCompile(`data-id="(\d+)"`).FindAllStringSubmatch(body, -1))
	}
	if got, want := ids("/dashboard/messages?db=stock"), fmt.Sprint([][]string{{fmt.Sprintf(`data-id="%d"`, binary), fmt.Sprint(binary)}}); got != want {
		t.Errorf("parked list = %s, want %s", got, want)
	}
	if got := ids("/dashboard/messages?db=stock&archived=1"); !strings.Contains(got, fmt.Sprint(edited)) || !strings.Contains(got, fmt.Sprint(sent)) {
		t.Errorf("archived list = %s, want %d and %d", got, edited, sent)
	}
	if n := pg.Count(t, "outbox WHERE type = $1", idem.FailureMessageResolved); n != 2 {
		t.Errorf("resolved notices: %d, want 2 (redirect, archive)", n)
	}

	// Without a publisher to one consumer, sending is disabled.
	plain := setup(t, nil)
	other := plain.park(t, idem.FailedMessage{Source: "stock.events", EventID: uuid.New(), Body: []byte("{}")})
	if code, body := plain.get(t, fmt.Sprintf("/dashboard/messages/stock/%d/redirect", other)); code != http.StatusConflict ||
		!strings.Contains(body, "publish to one consumer only") || strings.Contains(body, `name="csrf"`) {
		t.Errorf("redirect form without a publisher: %d\n%s", code, body)
	}
	if code, body := plain.get(t, fmt.Sprintf("/dashboard/messages/stock/%d", other)); code != http.StatusOK || !strings.Contains(body, `id="redirect" disabled`) {
		t.Errorf("message page without a publisher to one consumer: %d, want the send button disabled\n%s", code, body)
	}
}

// TestArchiveAll: "Archive all" of a group archives its messages, each with
// the action in its audit trail, and leaves the other group's.
func TestArchiveAll(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var ids []int64
	for i := range 3 {
		ids = append(ids, b.park(t, idem.FailedMessage{Source: "stock.events", EventID: uuid.New(), EventName: "order.order.placed.v1",
			Body: []byte(fmt.Sprint(i)), Error: fmt.Sprintf("field %q is %d", "qty", -i)}))
	}
	other := b.park(t, idem.FailedMessage{Source: "stock.events", EventID: uuid.New(), Body: []byte("x"), Error: "no such warehouse"})
	m, err := b.store.Get(context.Background(), ids[0])
	if err != nil {
		t.Fatal(err)
	}
	group, _, _ := inbox.GroupOf(m)
	path := "/dashboard/bulk/stock/archive"
	token := b.confirmToken(t, path+"?group="+group)
	resp := b.post(t, path, url.Values{"csrf": {token}, "group": {group}})
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || !strings.Contains(loc, "notice=archived-all") || !strings.Contains(loc, "n=3") {
		t.Fatalf("archive all: %d to %q, want a redirect with 3 archived", resp.StatusCode, loc)
	}
	for _, id := range ids {
		m, err := b.store.Get(context.Background(), id)
		if err != nil || m.Archived.IsZero() || len(m.Actions) != 1 || m.Actions[0].Action != idem.FailedArchive || m.Actions[0].By != "anonymous" {
			t.Errorf("message %d of the group: %+v, %v; want archived by anonymous", id, m, err)
		}
	}
	if m, err := b.store.Get(context.Background(), other); err != nil || !m.Archived.IsZero() {
		t.Errorf("the other group's message: %+v, %v; want it parked still", m, err)
	}
}
