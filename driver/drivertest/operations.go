package drivertest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/outbox"
)

// FailureStoreOperations checks what operators do to parked messages, byte
// for byte: an edit replaces the body and headers and keeps the message as
// received (the first edit's, whatever follows), a copy of the message as
// received is still found (FindFailed); every action is in the entry's
// audit trail with who did it (hostile text included); an archived entry
// is out of the default list, count, parked aggregates and consumer counts,
// listed with Archived, and back among them once parked again; a change of
// an entry that is gone reports it.
func FailureStoreOperations[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	ctx := testsvc.Ctx(t, time.Minute)
	d, ex := db.Driver.Dialect(), db.Driver.Pool()
	fs := inbox.NewFailureStore(db.Driver)
	received := idem.FailedMessage{
		Consumer: "stock", Source: "stock.events", EventID: idem.NewEventID(), EventName: "order.order.placed.v1",
		AggregateType: "order", AggregateID: "7", Key: []byte("7"),
		Headers: map[string]string{"x-trace": "abc", "gone": hostile[2]}, Body: randomBytes(t, 1<<16),
		Error: "boom", Attempts: 3,
	}
	id, err := fs.Save(ctx, received)
	fatalIf(t, err, "save")
	other, err := fs.Save(ctx, idem.FailedMessage{Consumer: "stock", EventID: idem.NewEventID(), AggregateType: "order", AggregateID: "8",
		Body: []byte("other"), Error: "boom", Attempts: 1})
	fatalIf(t, err, "save another")

	// Two edits, by hostile names: the body and headers are the last
	// edit's, the original the message as received.
	edited := []byte(`{"fixed":true}` + "\x00\xff")
	headers := map[string]string{"x-trace": "abc", "x-fix": hostile[0], hostile[4]: "\xff"}
	fatalIf(t, fs.As(hostile[1]).Edit(ctx, id, []byte("first edit"), nil), "first edit")
	fatalIf(t, fs.As(hostileText(300)).Edit(ctx, id, edited, headers), "second edit")
	got, err := fs.Get(ctx, id)
	fatalIf(t, err, "get the edited entry")
	switch {
	case !bytes.Equal(got.Body, edited):
		t.Errorf("edited body: %d bytes %q, want %q", len(got.Body), got.Body, edited)
	case !maps.Equal(got.Headers, headers):
		t.Errorf("edited headers = %q, want %q", got.Headers, headers)
	case got.Original == nil:
		t.Fatal("edited entry without its original")
	case !bytes.Equal(got.Original.Body, received.Body):
		t.Errorf("original body: %d bytes, want the %d received (different)", len(got.Original.Body), len(received.Body))
	case !maps.Equal(got.Original.Headers, received.Headers):
		t.Errorf("original headers = %q, want %q", got.Original.Headers, received.Headers)
	case got.EventID != received.EventID || got.Error != received.Error || got.Attempts != received.Attempts:
		t.Errorf("an edit changed more than the message: %+v", got)
	}
	if len(got.Actions) != 2 || got.Actions[0].Action != idem.FailedEdit || got.Actions[0].By != hostile[1] ||
		got.Actions[1].By != hostileText(300) || got.Actions[1].Detail == "" || time.Since(got.Actions[1].At).Abs() > time.Hour {
		t.Errorf("audit trail after two edits = %+v", got.Actions)
	}
	// A copy of the message as received, or as edited, is found.
	for what, body := range map[string][]byte{"as received": received.Body, "as edited": edited} {
		found, err := d.FindFailed(ctx, ex, "stock", received.EventID, body)
		fatalIf(t, err, "find %s", what)
		if found != id {
			t.Errorf("find the message %s = %d, want %d", what, found, id)
		}
	}
	if found, err := d.FindFailed(ctx, ex, "stock", received.EventID, []byte("first edit")); err != nil || found != 0 {
		t.Errorf("find an intermediate edit = %d, %v; want none", found, err)
	}
	// The entry of a message never edited has no original.
	if m, err := fs.Get(ctx, other); err != nil || m.Original != nil || len(m.Actions) != 0 || !m.Archived.IsZero() {
		t.Errorf("entry never changed = %+v, %v", m, err)
	}

	// Archived: out of the defaults, in the archived list.
	archived, err := fs.As("ops").Archive(ctx, id)
	fatalIf(t, err, "archive")
	if !archived {
		t.Fatal("archive reported nothing archived")
	}
	if again, err := fs.Archive(ctx, id); err != nil || again {
		t.Errorf("archive of an archived entry = %v, %v; want false", again, err)
	}
	ids := func(f idem.FailedFilter) []int64 {
		t.Helper()
		list, err := fs.List(ctx, f)
		fatalIf(t, err, "list %+v", f)
		var out []int64
		for _, m := range list {
			out = append(out, m.ID)
		}
		return out
	}
	count := func(f idem.FailedFilter) int64 {
		t.Helper()
		n, err := fs.Count(ctx, f)
		fatalIf(t, err, "count %+v", f)
		return n
	}
	heads := func() map[idem.AggregateRef]int64 {
		t.Helper()
		got, err := d.ParkedAggregates(ctx, ex, "stock", []idem.AggregateRef{ref("order", "7"), ref("order", "8")})
		fatalIf(t, err, "parked aggregates")
		return got
	}
	if got := ids(idem.FailedFilter{Consumer: "stock"}); len(got) != 1 || got[0] != other {
		t.Errorf("default list with entry %d archived = %v, want [%d]", id, got, other)
	}
	if got := ids(idem.FailedFilter{Consumer: "stock", Archived: true}); len(got) != 1 || got[0] != id {
		t.Errorf("archived list = %v, want [%d]", got, id)
	}
	if n, a := count(idem.FailedFilter{}), count(idem.FailedFilter{Archived: true}); n != 1 || a != 1 {
		t.Errorf("counts = %d and %d archived, want 1 and 1", n, a)
	}
	if h := heads(); len(h) != 1 || h[ref("order", "8")] != other {
		t.Errorf("parked aggregates with entry %d archived = %v, want order 8 only", id, h)
	}
	if c, err := d.ConsumerCounts(ctx, ex, "stock"); err != nil || c.Parked != 1 {
		t.Errorf("consumer counts with an entry archived = %+v, %v; want 1 parked", c, err)
	}
	got, err = fs.Get(ctx, id)
	fatalIf(t, err, "get the archived entry")
	if got.Archived.IsZero() || time.Since(got.Archived).Abs() > time.Hour || len(got.Actions) != 3 ||
		got.Actions[2].Action != idem.FailedArchive || got.Actions[2].By != "ops" {
		t.Errorf("archived entry: at %v, audit trail %+v", got.Archived, got.Actions)
	}
	// Parked again: not archived any more, its message as edited.
	_, err = fs.Save(ctx, idem.FailedMessage{ID: id, Consumer: "stock", Body: []byte("ignored"), Error: "again", Attempts: 1})
	fatalIf(t, err, "park the archived entry again")
	got, err = fs.Get(ctx, id)
	fatalIf(t, err, "get the entry parked again")
	if !got.Archived.IsZero() || !bytes.Equal(got.Body, edited) || got.Original == nil || len(got.Actions) != 3 {
		t.Errorf("entry parked again: archived at %v, body %q, original %v, %d actions", got.Archived, got.Body, got.Original != nil, len(got.Actions))
	}
	if n := count(idem.FailedFilter{Consumer: "stock"}); n != 2 {
		t.Errorf("count after the archived entry was parked again = %d, want 2", n)
	}
	if h := heads(); len(h) != 2 {
		t.Errorf("parked aggregates after the archived entry was parked again = %v, want both", h)
	}

	// An action alone, and changes of an entry that is gone.
	ok, err := d.ChangeFailed(ctx, ex, other, driver.FailedChange{Action: idem.FailedAction{Action: idem.FailedRetry, By: "\x00", Detail: "to stock.events"}})
	if err != nil || !ok {
		t.Fatalf("record an action: %v, %v", ok, err)
	}
	if m, err := fs.Get(ctx, other); err != nil || len(m.Actions) != 1 || m.Actions[0].By != "\x00" || m.Original != nil || !m.Archived.IsZero() {
		t.Errorf("entry with an action recorded = %+v, %v", m, err)
	}
	_, err = fs.Remove(ctx, other)
	fatalIf(t, err, "remove")
	if ok, err := d.ChangeFailed(ctx, ex, other, driver.FailedChange{Archive: true}); err != nil || ok {
		t.Errorf("archive a removed entry = %v, %v; want false", ok, err)
	}
	if err := fs.Edit(ctx, other, []byte("x"), nil); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("edit a removed entry: err = %v, want ErrNotFound", err)
	}
}

// consumerPublisher records what PublishToConsumer is asked to send.
type consumerPublisher struct{ sent map[string][]idem.Message }

// PublishToConsumer implements broker.ConsumerPublisher.
func (p *consumerPublisher) PublishToConsumer(_ context.Context, consumer string, msgs []idem.Message) error {
	if p.sent == nil {
		p.sent = map[string][]idem.Message{}
	}
	p.sent[consumer] = append(p.sent[consumer], msgs...)
	return nil
}

// FailureNotices checks inbox.Config.OnFailure and
// FailureStore.WithFailureHook with outbox.FailureEvents: a park writes
// exactly one notice into the outbox, in its transaction (a park whose
// transaction fails writes none, nor any entry; a copy of a parked message
// parked again writes none, unless it was archived); a re-driven message
// applied writes one resolved notice, as do a removal, an archive and a
// redirect; a message that is itself a notice gets none. The notice holds
// the consumer, class, group, ids and error (a NUL in it replaced, for
// PostgreSQL's jsonb), never the body.
func FailureNotices[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	db.exec(t, reservationTable)
	ctx := testsvc.Ctx(t, time.Minute)
	events := outbox.FailureEvents(outbox.NewWriter(db.Driver), outbox.FailureEventsConfig{})
	hookFails := true
	c := consumerWith(t, db, inbox.Config{Name: "stock", Parked: inbox.ReleaseAggregate, OnFailure: func(ctx context.Context, ex driver.Executor, n idem.FailureNotice) error {
		if err := events(ctx, ex, n); err != nil {
			return err
		}
		if hookFails && n.Name == idem.FailureMessageParked {
			return errors.New("the notice's transaction fails after writing it")
		}
		return nil
	}}, func(_ context.Context, _ driver.Executor, ev idem.Event) error {
		if !bytes.Contains(ev.Payload, []byte("fixed")) {
			return idem.Permanent(errors.New("order refused: \x00 bad"))
		}
		return nil
	})
	notices := func(name string) []idem.FailureNotice {
		t.Helper()
		var out []idem.FailureNotice
		err := driver.QueryRows(ctx, db.Driver.Pool(), db.bind(`SELECT payload FROM outbox WHERE type = ? ORDER BY seq`), []any{name}, func(rows driver.Rows) error {
			var raw []byte
			if err := rows.Scan(&raw); err != nil {
				return err
			}
			var n idem.FailureNotice
			if err := json.Unmarshal(raw, &n); err != nil {
				return err
			}
			if bytes.Contains(raw, []byte(`"body"`)) || bytes.Contains(raw, []byte(`"headers"`)) {
				t.Errorf("a notice holds the message: %s", raw)
			}
			out = append(out, n)
			return nil
		})
		fatalIf(t, err, "read the notices %s", name)
		return out
	}

	// The park's transaction fails: no entry, no notice; the transport
	// delivers the message again.
	ev := placed(t, "1")
	d := delivery(t, ev)
	disps, errs := c.DeliverBatch(ctx, []inbox.Delivery{d})
	if errs[0] == nil || disps[0].Action == inbox.Ack {
		t.Fatalf("a park whose notice failed: %+v, %v; want an error, not acknowledged", disps[0], errs[0])
	}
	if n, p := db.count(t, "failed_message"), len(notices(idem.FailureMessageParked)); n != 0 || p != 0 {
		t.Fatalf("after a park that failed: %d entries, %d notices; want none", n, p)
	}
	// Delivered again: parked, one notice.
	hookFails = false
	if got := deliver(t, c, d); got[0].Outcome != inbox.Parked {
		t.Fatalf("delivered again: %+v, want parked", got[0])
	}
	list, err := c.Failures().List(ctx, idem.FailedFilter{})
	fatalIf(t, err, "list")
	if len(list) != 1 {
		t.Fatalf("%d entries, want 1", len(list))
	}
	entry := list[0]
	// A copy of it (a broker's redelivery after a crash before the
	// acknowledgement) is parked in the same entry, told of once.
	if got := deliver(t, c, d); got[0].Outcome != inbox.Parked {
		t.Fatalf("a copy delivered: %+v, want parked", got[0])
	}
	parked := notices(idem.FailureMessageParked)
	if n := db.count(t, "failed_message"); len(parked) != 1 || n != 1 {
		t.Fatalf("%d parked notices, %d entries after a copy was parked; want 1 and 1", len(parked), n)
	}
	group, class, _ := inbox.GroupOf(entry)
	if n := parked[0]; n.Consumer != "stock" || n.FailedMessageID != entry.ID || n.EventID != ev.ID || n.EventName != ev.Name ||
		n.AggregateType != "order" || n.AggregateID != "1" || n.Class != class || class != "permanent" || n.Group != group ||
		n.Error != strings.ReplaceAll(entry.Error, "\x00", "\uFFFD") || n.Source != "stock.events" || n.At.IsZero() {
		t.Errorf("parked notice = %+v; entry %+v", n, entry)
	}

	// Re-driven with a fixed body and applied: one resolved notice.
	fixed := ev
	fixed.Payload = json.RawMessage(`{"order_id":"1","fixed":true}`)
	fatalIf(t, c.Failures().As("ops").Edit(ctx, entry.ID, mustMessage(t, fixed).Body, entry.Headers), "edit")
	edited, err := c.Failures().Get(ctx, entry.ID)
	fatalIf(t, err, "get the edited entry")
	if got := deliver(t, c, redriveDelivery(t, edited)); got[0].Outcome != inbox.Applied {
		t.Fatalf("the edited message re-driven: %+v, want applied", got[0])
	}
	if _, err := c.Failures().Get(ctx, entry.ID); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("the edited message applied: its entry is still there (%v)", err)
	}
	resolved := notices(idem.FailureMessageResolved)
	if len(resolved) != 1 || resolved[0].Resolution != idem.ResolvedRetried || resolved[0].FailedMessageID != entry.ID {
		t.Fatalf("resolved notices after the retry = %+v, want one, retried", resolved)
	}

	// Removed, archived, redirected by an operator through a store with
	// the hook: one resolved notice each, with who.
	var ds []inbox.Delivery
	for _, id := range []string{"2", "3", "4"} {
		ds = append(ds, delivery(t, placed(t, id)))
		deliver(t, c, ds[len(ds)-1])
	}
	list, err = c.Failures().List(ctx, idem.FailedFilter{Oldest: true})
	fatalIf(t, err, "list")
	if len(list) != 3 || len(notices(idem.FailureMessageParked)) != 4 {
		t.Fatalf("%d entries, %d parked notices; want 3 and 4", len(list), len(notices(idem.FailureMessageParked)))
	}
	ops := inbox.NewFailureStore(db.Driver).WithFailureHook(events).As("alice")
	if ok, err := ops.Remove(ctx, list[0].ID); err != nil || !ok {
		t.Fatalf("remove: %v, %v", ok, err)
	}
	if ok, err := ops.Archive(ctx, list[1].ID); err != nil || !ok {
		t.Fatalf("archive: %v, %v", ok, err)
	}
	var pub consumerPublisher
	fatalIf(t, ops.Redirect(ctx, &pub, list[2], "billing"), "redirect")
	if sent := pub.sent["billing"]; len(sent) != 1 || !bytes.Equal(sent[0].Body, list[2].Body) || sent[0].EventID != list[2].EventID ||
		sent[0].Headers[idem.HeaderRedrive] != "" {
		t.Errorf("redirected = %+v, want the message, without a re-drive mark", sent)
	}
	resolved = notices(idem.FailureMessageResolved)
	want := []struct {
		res string
		id  int64
	}{{idem.ResolvedRetried, entry.ID}, {idem.ResolvedRemoved, list[0].ID}, {idem.ResolvedArchived, list[1].ID}, {idem.ResolvedRedirected, list[2].ID}}
	if len(resolved) != len(want) {
		t.Fatalf("%d resolved notices, want %d: %+v", len(resolved), len(want), resolved)
	}
	for i, w := range want {
		if n := resolved[i]; n.Resolution != w.res || n.FailedMessageID != w.id || (i > 0 && n.By != "alice") {
			t.Errorf("resolved notice %d = %+v, want %s of %d by alice", i, n, w.res, w.id)
		}
	}
	if resolved[3].RedirectedTo != "billing" {
		t.Errorf("redirect notice to %q, want billing", resolved[3].RedirectedTo)
	}
	if err := ops.Redirect(ctx, &pub, list[0], "stock"); err == nil {
		t.Error("a redirect to the message's own consumer succeeded, want an error")
	}
	// Already gone or archived: nothing happens, no notice.
	if ok, err := ops.Remove(ctx, list[0].ID); err != nil || ok {
		t.Errorf("remove again = %v, %v", ok, err)
	}
	if ok, err := ops.Archive(ctx, list[1].ID); err != nil || ok {
		t.Errorf("archive again = %v, %v", ok, err)
	}
	if n := len(notices(idem.FailureMessageResolved)); n != len(want) {
		t.Errorf("%d resolved notices after actions that did nothing, want %d", n, len(want))
	}
	// A copy of the archived message fails again: parked again, told of.
	if got := deliver(t, c, ds[1]); got[0].Outcome != inbox.Parked {
		t.Fatalf("a copy of the archived message: %+v, want parked", got[0])
	}
	if p := notices(idem.FailureMessageParked); len(p) != 5 || p[4].FailedMessageID != list[1].ID {
		t.Errorf("parked notices after the archived message was parked again = %+v, want a fifth, of %d", p, list[1].ID)
	}

	// A notice parked by a consumer gets no notice of its own.
	notice, err := outbox.FailureEvent(parked[0], outbox.FailureEventsConfig{})
	fatalIf(t, err, "notice event")
	if got := deliver(t, c, delivery(t, notice)); got[0].Outcome != inbox.Parked {
		t.Fatalf("a notice delivered: %+v, want parked (the handler refuses it)", got[0])
	}
	if n := len(notices(idem.FailureMessageParked)); n != 5 {
		t.Errorf("%d parked notices after a notice was parked, want still 5", n)
	}
	if n := db.count(t, "failed_message WHERE event_id = ?", notice.ID.String()); n != 1 {
		t.Errorf("%d entries of the parked notice, want 1", n)
	}
}

// mustMessage returns the message of ev.
func mustMessage(t *testing.T, ev idem.Event) idem.Message {
	t.Helper()
	m, err := idem.NewMessage(ev)
	fatalIf(t, err, "message")
	return m
}
