package drivertest

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testsvc"
)

// hostile are strings that text and JSON columns mishandle: backslashes,
// quotes, NUL, invalid UTF-8, JSON-looking text, trailing spaces, and text
// that looks like the encoding of another string.
var hostile = []string{
	`back\slash \\ \n \x00 \u0000`,
	`"double" 'single' ` + "`back`",
	"nul\x00inside",
	"\xff\xfe",
	"bad \xc3 utf8 \xed\xa0\x80",
	`{"a":1}`,
	`"\u0000"`,
	"trailing space ",
	`Post "http://carrier.example/pickups?ref=a\b": dial tcp 10.0.0.1:443: connect: connection refused`,
	`idem:quoted:"looks encoded"`,
	"idem:quoted:",
	"crème \u2028 \U0001F4E6",
	"",
}

// hostileText joins every hostile string, repeated to about n bytes.
func hostileText(n int) string {
	unit := strings.Join(hostile, "|")
	return strings.Repeat(unit, n/len(unit)+1)[:n]
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	// Make sure the bytes the columns mishandle are there.
	copy(b, "\x00\xff\xfe\\\"'{}")
	return b
}

// sameFailed compares what a FailedMessage holds, byte for byte (History:
// attempts and errors, not times).
func sameFailed(got, want idem.FailedMessage) error {
	var diffs []string
	str := func(field, g, w string) {
		if g != w {
			if len(g) > 200 || len(w) > 200 {
				diffs = append(diffs, fmt.Sprintf("%s: %d bytes, want %d bytes (different)", field, len(g), len(w)))
			} else {
				diffs = append(diffs, fmt.Sprintf("%s: %q, want %q", field, g, w))
			}
		}
	}
	str("Consumer", got.Consumer, want.Consumer)
	str("Source", got.Source, want.Source)
	str("EventName", got.EventName, want.EventName)
	str("AggregateType", got.AggregateType, want.AggregateType)
	str("AggregateID", got.AggregateID, want.AggregateID)
	str("Error", got.Error, want.Error)
	if got.EventID != want.EventID {
		diffs = append(diffs, fmt.Sprintf("EventID: %v, want %v", got.EventID, want.EventID))
	}
	if got.HeldBy != want.HeldBy {
		diffs = append(diffs, fmt.Sprintf("HeldBy: %d, want %d", got.HeldBy, want.HeldBy))
	}
	if got.Attempts != want.Attempts {
		diffs = append(diffs, fmt.Sprintf("Attempts: %d, want %d", got.Attempts, want.Attempts))
	}
	if !bytes.Equal(got.Key, want.Key) {
		diffs = append(diffs, fmt.Sprintf("Key: %q, want %q", got.Key, want.Key))
	}
	if !bytes.Equal(got.Body, want.Body) {
		diffs = append(diffs, fmt.Sprintf("Body: %d bytes, want %d bytes (different)", len(got.Body), len(want.Body)))
	}
	if len(got.Headers)+len(want.Headers) > 0 && !maps.Equal(got.Headers, want.Headers) {
		diffs = append(diffs, fmt.Sprintf("Headers: %q, want %q", got.Headers, want.Headers))
	}
	if len(got.History) != len(want.History) {
		diffs = append(diffs, fmt.Sprintf("History: %d entries, want %d", len(got.History), len(want.History)))
	} else {
		for i := range got.History {
			str(fmt.Sprintf("History[%d].Error", i), got.History[i].Error, want.History[i].Error)
			if got.History[i].Attempt != want.History[i].Attempt {
				diffs = append(diffs, fmt.Sprintf("History[%d].Attempt: %d, want %d", i, got.History[i].Attempt, want.History[i].Attempt))
			}
		}
	}
	if len(diffs) > 0 {
		return errors.New(strings.Join(diffs, "\n"))
	}
	return nil
}

// FailureStoreBytes saves messages with hostile content (backslashes,
// quotes, NUL, invalid UTF-8, JSON-looking text, a 100 kB error, 1 MB
// bodies, headers holding all of these) and reads them back with List and
// Get, byte for byte; then saves the first again with its id (an update
// that appends to its history and keeps the message as first stored) and
// reads it back again. Filters on hostile consumer and event names find
// exactly their entries.
func FailureStoreBytes[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	ctx := testsvc.Ctx(t, 2*time.Minute)
	fs := inbox.NewFailureStore(db.Driver)
	consumer := "stock\x00\xff "
	headers := map[string]string{}
	for i, h := range hostile {
		headers[h] = hostile[len(hostile)-1-i]
	}
	headers["long"] = hostileText(10_000)
	first := idem.FailedMessage{
		Consumer: consumer, Source: `stock.events\` + "\x00\"", EventID: idem.NewEventID(),
		EventName: "order.order.placed.v1\x00\xff", AggregateType: "ord\xffer", AggregateID: `42\ "x" ` + "\x00 ",
		Key: []byte("\x00key\xff\\"), Headers: headers, Body: randomBytes(t, 1<<20),
		Error: hostileText(100_000), Attempts: 3,
	}
	undecodable := idem.FailedMessage{
		Consumer: consumer, Source: `{"a":1}`, Body: randomBytes(t, 1<<20), Error: `"\u0000"` + "\x00", Attempts: 1,
	}
	held := idem.FailedMessage{
		Consumer: consumer, EventID: idem.NewEventID(), EventName: `idem:quoted:"order.order.placed.v1"`,
		AggregateType: first.AggregateType, AggregateID: first.AggregateID, Headers: map[string]string{"": ""},
		Body: []byte{}, Error: "waits behind", Attempts: 0,
	}
	plain := idem.FailedMessage{Consumer: consumer + "-plain", EventID: idem.NewEventID(), EventName: "order.order.placed.v1",
		Body: []byte(`{"event_id":"x"}`), Error: "plain", Attempts: 1}

	var want []idem.FailedMessage
	for _, m := range []*idem.FailedMessage{&first, &undecodable, &held, &plain} {
		if m == &held {
			m.HeldBy = first.ID
		}
		id, err := fs.Save(ctx, *m)
		fatalIf(t, err, "save")
		m.ID = id
		m.History = []idem.FailureRecord{{Attempt: m.Attempts, Error: m.Error}}
		want = append(want, *m)
	}
	check := func(step string) {
		t.Helper()
		for _, w := range want {
			got, err := fs.Get(ctx, w.ID)
			fatalIf(t, err, "%s: get %d", step, w.ID)
			if err := sameFailed(got, w); err != nil {
				t.Errorf("%s: get %d:\n%v", step, w.ID, err)
			}
		}
		list, err := fs.List(ctx, idem.FailedFilter{Consumer: consumer})
		fatalIf(t, err, "%s: list", step)
		if len(list) != 3 {
			t.Fatalf("%s: list of the hostile consumer = %d entries, want 3", step, len(list))
		}
		for i, got := range list {
			w := want[2-i] // newest first
			if got.ID != w.ID {
				t.Fatalf("%s: list[%d] = entry %d, want %d", step, i, got.ID, w.ID)
			}
			if err := sameFailed(got, w); err != nil {
				t.Errorf("%s: list[%d]:\n%v", step, i, err)
			}
		}
		for _, f := range []struct {
			filter idem.FailedFilter
			want   int64
		}{
			{idem.FailedFilter{Consumer: consumer, EventName: first.EventName}, first.ID},
			{idem.FailedFilter{Consumer: consumer, EventName: held.EventName}, held.ID},
			{idem.FailedFilter{EventName: "order.order.placed.v1", Consumer: plain.Consumer}, plain.ID},
			{idem.FailedFilter{Consumer: consumer, HeldBy: first.ID}, held.ID},
			{idem.FailedFilter{Consumer: consumer, AggregateType: first.AggregateType, AggregateID: first.AggregateID, Oldest: true}, first.ID},
		} {
			list, err := fs.List(ctx, f.filter)
			fatalIf(t, err, "%s: list %+v", step, f.filter)
			if len(list) == 0 || list[0].ID != f.want {
				t.Errorf("%s: list %q = %d entries, want entry %d first", step, fmt.Sprintf("%+v", f.filter), len(list), f.want)
			}
		}
		for _, name := range []string{"order.order.placed.v1\x00", "order.order.placed.v1 ", `"order.order.placed.v1"`, `idem:quoted:"order.order.placed.v1"`} {
			list, err := fs.List(ctx, idem.FailedFilter{Consumer: plain.Consumer, EventName: name})
			fatalIf(t, err, "%s: list %q", step, name)
			if len(list) != 0 {
				t.Errorf("%s: list of event name %q = %d entries, want none", step, name, len(list))
			}
		}
	}
	check("after save")

	// Saved again with its id: the entry's history is appended, its
	// message stays as first stored, whatever the save holds.
	again := first
	again.Error = hostileText(50_000) + "\xff"
	again.Headers = map[string]string{"\x00": "\xff", "x-attempt": "6"}
	again.Body = randomBytes(t, 1<<20)
	again.Key = nil
	again.Attempts = 3
	id, err := fs.Save(ctx, again)
	fatalIf(t, err, "save again")
	if id != first.ID {
		t.Fatalf("saving again with the entry's id made entry %d, want %d updated", id, first.ID)
	}
	want[0].Error = again.Error
	want[0].Attempts = 6
	want[0].History = []idem.FailureRecord{{Attempt: 3, Error: first.Error}, {Attempt: 3, Error: again.Error}}
	check("after a second save")
}

// FailureStorePaging checks that List with Limit 0 returns every match (250
// entries, more than a page), newest or oldest first, that a Limit is a
// page size, the keyset cursor, and Count of the same filters.
func FailureStorePaging[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	ctx := testsvc.Ctx(t, 2*time.Minute)
	fs := inbox.NewFailureStore(db.Driver)
	const n = 250
	ids := make([]int64, n)
	for i := range ids {
		var err error
		ids[i], err = fs.Save(ctx, idem.FailedMessage{
			Consumer: "stock", EventID: idem.NewEventID(), EventName: fmt.Sprintf("order.order.e%d.v1", i%2),
			AggregateType: "order", AggregateID: fmt.Sprint(i % 10), Body: []byte(fmt.Sprint(i)), Error: "boom", Attempts: 1,
		})
		fatalIf(t, err, "save %d", i)
		if i > 0 && ids[i] <= ids[i-1] {
			t.Fatalf("entry ids do not grow: %d after %d", ids[i], ids[i-1])
		}
	}
	_, err := fs.Save(ctx, idem.FailedMessage{Consumer: "billing", Body: []byte("x"), Error: "other", Attempts: 1})
	fatalIf(t, err, "save billing")

	listIDs := func(f idem.FailedFilter) []int64 {
		t.Helper()
		list, err := fs.List(ctx, f)
		fatalIf(t, err, "list %+v", f)
		out := make([]int64, len(list))
		for i, m := range list {
			out[i] = m.ID
		}
		return out
	}
	reversed := func(s []int64) []int64 {
		out := make([]int64, len(s))
		for i, v := range s {
			out[len(s)-1-i] = v
		}
		return out
	}
	equal := func(what string, got, want []int64) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s = %d entries %v, want %d entries", what, len(got), got, len(want))
		}
	}
	equal("all, newest first", listIDs(idem.FailedFilter{Consumer: "stock"}), reversed(ids))
	equal("all, oldest first", listIDs(idem.FailedFilter{Consumer: "stock", Oldest: true}), ids)
	equal("limit 7", listIDs(idem.FailedFilter{Consumer: "stock", Limit: 7}), reversed(ids)[:7])
	equal("before", listIDs(idem.FailedFilter{Consumer: "stock", BeforeID: ids[100], Limit: 3}), []int64{ids[99], ids[98], ids[97]})
	equal("after", listIDs(idem.FailedFilter{Consumer: "stock", AfterID: ids[100], Oldest: true, Limit: 3}), []int64{ids[101], ids[102], ids[103]})
	equal("between", listIDs(idem.FailedFilter{Consumer: "stock", AfterID: ids[10], BeforeID: ids[14], Oldest: true}), ids[11:14])
	var evens []int64
	for i := 0; i < n; i += 2 {
		evens = append(evens, ids[i])
	}
	equal("by event name, all", listIDs(idem.FailedFilter{EventName: "order.order.e0.v1", Oldest: true}), evens)
	var agg3 []int64
	for i := 3; i < n; i += 10 {
		agg3 = append(agg3, ids[i])
	}
	equal("by aggregate", listIDs(idem.FailedFilter{Consumer: "stock", AggregateType: "order", AggregateID: "3", Oldest: true}), agg3)
	if got := listIDs(idem.FailedFilter{}); len(got) != n+1 {
		t.Errorf("every consumer = %d entries, want %d", len(got), n+1)
	}
	// Count: what a run over every match would go through, whatever the
	// page size.
	for what, c := range map[string]struct {
		f    idem.FailedFilter
		want int
	}{
		"all of a consumer": {idem.FailedFilter{Consumer: "stock", Limit: 7}, n},
		"every consumer":    {idem.FailedFilter{}, n + 1},
		"between":           {idem.FailedFilter{Consumer: "stock", AfterID: ids[10], BeforeID: ids[14]}, 3},
		"by event name":     {idem.FailedFilter{EventName: "order.order.e0.v1"}, len(evens)},
		"by aggregate":      {idem.FailedFilter{Consumer: "stock", AggregateType: "order", AggregateID: "3"}, len(agg3)},
		"since":             {idem.FailedFilter{Consumer: "stock", Since: time.Now().Add(time.Hour)}, 0},
		"none":              {idem.FailedFilter{Consumer: "shipping"}, 0},
	} {
		got, err := fs.Count(ctx, c.f)
		fatalIf(t, err, "count %s", what)
		if got != int64(c.want) {
			t.Errorf("Count, %s = %d, want %d", what, got, c.want)
		}
	}

	// Pages: removing the entries of each page does not disturb the next.
	var seen []int64
	err = fs.Pages(ctx, idem.FailedFilter{Consumer: "stock", Oldest: true, Limit: 40}, func(page []idem.FailedMessage) error {
		if len(page) > 40 {
			t.Errorf("page of %d entries, want at most 40", len(page))
		}
		for _, m := range page {
			seen = append(seen, m.ID)
			if _, err := fs.Remove(ctx, m.ID); err != nil {
				return err
			}
		}
		return nil
	})
	fatalIf(t, err, "pages")
	equal("pages removing as they go", seen, ids)
	if _, err := fs.List(ctx, idem.FailedFilter{Limit: -1}); err == nil {
		t.Error("negative limit accepted")
	}
	if _, err := db.Driver.Dialect().ListFailed(ctx, db.Driver.Pool(), idem.FailedFilter{}); err == nil {
		t.Error("dialect ListFailed accepted a zero page size")
	}
}

// ParkedAggregates checks the aggregates that have a message parked for its
// own failure, their oldest one, and HasParkedAggregates.
func ParkedAggregates[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	ctx := testsvc.Ctx(t, 2*time.Minute)
	d := db.Driver.Dialect()
	ex := db.Driver.Pool()
	save := func(consumer, aggType, aggID string, heldBy int64) int64 {
		t.Helper()
		id, err := d.SaveFailed(ctx, ex, idem.FailedMessage{Consumer: consumer, EventID: idem.NewEventID(),
			AggregateType: aggType, AggregateID: aggID, HeldBy: heldBy, Body: []byte("x"), Error: "boom", Attempts: 1})
		fatalIf(t, err, "save")
		return id
	}
	hostileID := "4\x00\xff \"2\" "
	head1 := save("stock", "order", "1", 0)
	save("stock", "order", "1", head1)
	save("stock", "order", "1", 0) // a later failure of its own: the oldest stays head1
	save("stock", "order", "2", head1)
	save("stock", "order", "", 0)
	save("stock", "", "", 0)
	headHostile := save("stock", "ord\xffer", hostileID, 0)
	headCustomer := save("stock", "customer", "1", 0)
	save("billing", "order", "3", 0)

	aggs := []idem.AggregateRef{
		ref("order", "1"), ref("order", "2"), ref("order", ""), ref("order", "3"), ref("ord\xffer", hostileID),
		ref("order", hostileID), ref("customer", "1"), ref("order", "1"), ref("order", "1 "), ref("order", "01"),
	}
	for i := range 2500 {
		aggs = append(aggs, idem.AggregateRef{Type: "order", ID: fmt.Sprint("many-", i)})
	}
	got, err := d.ParkedAggregates(ctx, ex, "stock", aggs)
	fatalIf(t, err, "parked aggregates")
	want := map[idem.AggregateRef]int64{
		ref("order", "1"): head1, ref("ord\xffer", hostileID): headHostile, ref("customer", "1"): headCustomer,
	}
	if !maps.Equal(got, want) {
		t.Errorf("parked aggregates = %+v, want %+v", got, want)
	}
	if got, err := d.ParkedAggregates(ctx, ex, "stock", nil); err != nil || len(got) != 0 {
		t.Errorf("parked aggregates of none = %v, %v", got, err)
	}
	if got, err := d.ParkedAggregates(ctx, ex, "billing", aggs[:4]); err != nil || len(got) != 1 || got[idem.AggregateRef{Type: "order", ID: "3"}] == 0 {
		t.Errorf("parked aggregates of billing = %v, %v; want order 3", got, err)
	}

	if n, err := d.PurgeFailed(ctx, ex, "nobody", time.Now(), 10); err != nil || n != 0 {
		t.Errorf("PurgeFailed of nobody = %d, %v", n, err)
	}
	for _, c := range []struct {
		consumer string
		want     bool
	}{{"stock", true}, {"billing", true}, {"shipping", false}} {
		has, err := d.HasParkedAggregates(ctx, ex, c.consumer)
		fatalIf(t, err, "has parked aggregates")
		if has != c.want {
			t.Errorf("HasParkedAggregates(%s) = %v, want %v", c.consumer, has, c.want)
		}
	}
	// Only held messages, or messages without aggregate: none.
	save("shipping", "order", "9", 12345)
	save("shipping", "order", "", 0)
	if has, err := d.HasParkedAggregates(ctx, ex, "shipping"); err != nil || has {
		t.Errorf("HasParkedAggregates(shipping) with held messages only = %v, %v; want false", has, err)
	}
}

func ref(typ, id string) idem.AggregateRef { return idem.AggregateRef{Type: typ, ID: id} }

// Attempts checks RecordAttempt (counts, concurrent calls, consumers
// apart), ClearAttempts and PurgeAttempts.
func Attempts[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	ctx := testsvc.Ctx(t, 2*time.Minute)
	d := db.Driver.Dialect()
	ex := db.Driver.Pool()
	id, other := idem.NewEventID(), idem.NewEventID()
	for i, errText := range []string{"first", hostileText(100_000), ""} {
		n, err := d.RecordAttempt(ctx, ex, "stock", id, errText)
		fatalIf(t, err, "record attempt %d", i+1)
		if n != i+1 {
			t.Errorf("attempt %d counted %d", i+1, n)
		}
	}
	if n, err := d.RecordAttempt(ctx, ex, "billing", id, "x"); err != nil || n != 1 {
		t.Errorf("first attempt of another consumer = %d, %v; want 1", n, err)
	}

	// In a transaction, with a NUL in the error; cleared, nothing is left
	// to purge.
	fatalIf(t, db.inTx(ctx, func(ex driver.Executor) error {
		for want := 1; want <= 3; want++ {
			n, err := d.RecordAttempt(ctx, ex, "stock-tx", id, "\x00 in a transaction")
			if err != nil {
				return err
			}
			if n != want {
				t.Errorf("in a transaction: attempt %d counted %d", want, n)
			}
		}
		if err := d.ClearAttempts(ctx, ex, "stock-tx", []uuid.UUID{id}); err != nil {
			return err
		}
		n, err := d.PurgeAttempts(ctx, ex, "stock-tx", time.Now().Add(time.Hour), 10)
		if err == nil && n != 0 {
			t.Errorf("purge after clear deleted %d rows", n)
		}
		return err
	}), "attempts in a transaction")

	// Concurrent calls each count once.
	const workers, each = 8, 10
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		counts = map[int]int{}
	)
	for range workers {
		wg.Go(func() {
			for range each {
				n, err := d.RecordAttempt(ctx, ex, "stock", other, "concurrent")
				if err != nil {
					t.Errorf("concurrent record attempt: %v", err)
					return
				}
				mu.Lock()
				counts[n]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for i := 1; i <= workers*each; i++ {
		if counts[i] != 1 {
			t.Errorf("count %d returned %d times, want once", i, counts[i])
		}
	}
	var attempts int
	db.queryRow(t, `SELECT attempts FROM delivery_attempt WHERE consumer_name = 'stock' AND event_id = ?`, []any{other.String()}, &attempts)
	if attempts != workers*each {
		t.Errorf("attempts = %d, want %d", attempts, workers*each)
	}

	fatalIf(t, d.ClearAttempts(ctx, ex, "stock", []uuid.UUID{id, other, idem.NewEventID()}), "clear")
	fatalIf(t, d.ClearAttempts(ctx, ex, "stock", nil), "clear none")
	if n := db.count(t, "delivery_attempt"); n != 1 {
		t.Errorf("attempt rows after clear = %d, want billing's only", n)
	}
	if n, err := d.RecordAttempt(ctx, ex, "stock", id, "again"); err != nil || n != 1 {
		t.Errorf("attempt after clear = %d, %v; want 1", n, err)
	}

	// Purge: 5 old rows of stock, 2 old of billing, the recent ones stay.
	old := time.Now().Add(-48 * time.Hour)
	for i := range 7 {
		consumer := "stock"
		if i >= 5 {
			consumer = "billing"
		}
		db.exec(t, `INSERT INTO delivery_attempt (consumer_name, event_id, attempts, last_error, first_failed_at, last_failed_at) VALUES (?, ?, 1, 'x', ?, ?)`,
			consumer, idem.NewEventID().String(), db.timeArg(old), db.timeArg(old))
	}
	n, err := d.PurgeAttempts(ctx, ex, "stock", time.Now().Add(-24*time.Hour), 3)
	fatalIf(t, err, "purge attempts")
	if n != 3 {
		t.Errorf("purge with limit 3 deleted %d", n)
	}
	n, err = d.PurgeAttempts(ctx, ex, "", time.Now().Add(-24*time.Hour), 100)
	fatalIf(t, err, "purge attempts of every consumer")
	if n != 4 {
		t.Errorf("purge of every consumer deleted %d, want 4", n)
	}
	if n := db.count(t, "delivery_attempt"); n != 2 {
		t.Errorf("attempt rows left = %d, want the 2 recent ones", n)
	}
}

// PurgeFailed checks inbox.PurgeFailed: the replay-window guard, batches,
// the consumer filter (also a hostile name) and the horizon.
func PurgeFailed[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	ctx := testsvc.Ctx(t, time.Minute)
	fs := inbox.NewFailureStore(db.Driver)
	now := time.Now()
	hostileName := "stock\x00\xff "
	// 25 old messages of stock, 5 old of the hostile name, 3 recent of stock.
	for i := range 33 {
		consumer, age := "stock", 40*24*time.Hour
		switch {
		case i >= 30:
			age = time.Hour
		case i >= 25:
			consumer = hostileName
		}
		id, err := fs.Save(ctx, idem.FailedMessage{Consumer: consumer, EventID: idem.NewEventID(), Body: []byte("x"), Error: "boom", Attempts: 1})
		fatalIf(t, err, "save")
		db.exec(t, `UPDATE failed_message SET first_failed_at = ?, failed_at = ? WHERE id = ?`, db.timeArg(now.Add(-age)), db.timeArg(now.Add(-age)), id)
	}
	_, err := inbox.PurgeFailed(ctx, db.Driver, inbox.PurgeConfig{Horizon: 7 * 24 * time.Hour, ReplayWindow: 30 * 24 * time.Hour})
	if !errors.Is(err, inbox.ErrHorizonTooShort) {
		t.Fatalf("purge with a horizon under the replay window: err = %v, want ErrHorizonTooShort", err)
	}
	if n := db.count(t, "failed_message"); n != 33 {
		t.Fatalf("refused purge deleted rows: %d left, want 33", n)
	}
	res, err := inbox.PurgeFailed(ctx, db.Driver, inbox.PurgeConfig{
		Consumer: "stock", Horizon: 31 * 24 * time.Hour, ReplayWindow: 30 * 24 * time.Hour, BatchSize: 10,
		Now: func() time.Time { return now },
	})
	fatalIf(t, err, "purge")
	if res.Deleted != 25 || res.Batches != 3 {
		t.Errorf("result = %+v, want 25 deleted in 3 batches of at most 10", res)
	}
	left, err := fs.List(ctx, idem.FailedFilter{})
	fatalIf(t, err, "list")
	if len(left) != 8 {
		t.Errorf("messages left = %d, want 8 (3 recent of stock, 5 of the other consumer)", len(left))
	}
	res, err = inbox.PurgeFailed(ctx, db.Driver, inbox.PurgeConfig{Consumer: hostileName, Horizon: 31 * 24 * time.Hour, ReplayWindow: 30 * 24 * time.Hour})
	fatalIf(t, err, "purge the other consumer")
	if res.Deleted != 5 {
		t.Errorf("purge of %q deleted %d, want 5", hostileName, res.Deleted)
	}
	if n := db.count(t, "failed_message"); n != 3 {
		t.Errorf("messages left = %d, want the 3 recent ones", n)
	}
}

// FailureStoreOneEntry checks that the failure store keeps one entry per
// message. Two messages with the same event id, other bodies and other
// aggregates, are two entries, each with its own bytes and its own hold. A
// save with an entry's id records one more failure of that entry (attempts
// added, history appended, error and held-by replaced) and keeps the message
// as first stored; with the id of an entry that is gone, or of another
// consumer's, it adds an entry, with an id never used before. FindFailed
// finds an entry by consumer, event id and body, byte for byte.
func FailureStoreOneEntry[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	ctx := testsvc.Ctx(t, time.Minute)
	d, ex := db.Driver.Dialect(), db.Driver.Pool()
	fs := inbox.NewFailureStore(db.Driver)
	evID := idem.NewEventID()
	first := idem.FailedMessage{
		Consumer: "stock", Source: "stock.events", EventID: evID, EventName: "order.order.placed.v1",
		AggregateType: "order", AggregateID: "1", Key: []byte("1"), Headers: map[string]string{"x-trace": "first"},
		Body: []byte("{\"order\":1}\x00\xff"), Error: "first failure", Attempts: 3,
	}
	second := idem.FailedMessage{
		Consumer: "stock", Source: "stock.events", EventID: evID, EventName: "order.order.placed.v1",
		AggregateType: "order", AggregateID: "2", Key: []byte("2"), Headers: map[string]string{"x-trace": "second"},
		Body: []byte("{\"order\":2}\x00\xff"), Error: "second failure", Attempts: 1,
	}
	save := func(what string, m *idem.FailedMessage) {
		t.Helper()
		id, err := d.SaveFailed(ctx, ex, *m)
		fatalIf(t, err, "save %s", what)
		m.ID = id
		m.History = []idem.FailureRecord{{Attempt: m.Attempts, Error: m.Error}}
	}
	check := func(step string, want ...idem.FailedMessage) {
		t.Helper()
		for _, w := range want {
			got, err := fs.Get(ctx, w.ID)
			fatalIf(t, err, "%s: get %d", step, w.ID)
			if err := sameFailed(got, w); err != nil {
				t.Errorf("%s: entry %d:\n%v", step, w.ID, err)
			}
			if got.LastFailed.Before(got.FirstFailed) {
				t.Errorf("%s: entry %d last failed %v, before its first failure %v", step, w.ID, got.LastFailed, got.FirstFailed)
			}
		}
	}
	heads := func(step string, want map[idem.AggregateRef]int64) {
		t.Helper()
		got, err := d.ParkedAggregates(ctx, ex, "stock", []idem.AggregateRef{ref("order", "1"), ref("order", "2")})
		fatalIf(t, err, "%s: parked aggregates", step)
		if !maps.Equal(got, want) {
			t.Errorf("%s: parked aggregates = %v, want %v", step, got, want)
		}
	}

	// Two messages with one event id: two entries, each its bytes and hold.
	save("first", &first)
	save("second", &second)
	if second.ID == first.ID {
		t.Fatalf("a second message with the event id of entry %d was saved in that entry", first.ID)
	}
	check("two messages with one event id", first, second)
	heads("two messages with one event id", map[idem.AggregateRef]int64{ref("order", "1"): first.ID, ref("order", "2"): second.ID})
	// A third one, held behind the first: the first keeps its hold.
	held := first
	held.ID, held.Body, held.Headers, held.HeldBy, held.Error, held.Attempts = 0, []byte("{\"order\":1,\"v\":2}"), nil, first.ID, "held", 1
	save("held", &held)
	if held.ID == first.ID || held.ID == second.ID {
		t.Fatalf("a held message with a parked event id was saved in entry %d", held.ID)
	}
	check("a held message with the same event id", first, second, held)
	heads("a held message with the same event id", map[idem.AggregateRef]int64{ref("order", "1"): first.ID, ref("order", "2"): second.ID})

	// FindFailed: consumer, event id and body, byte for byte.
	empty := idem.FailedMessage{Consumer: "stock", EventID: idem.NewEventID(), Body: []byte{}, Error: "empty", Attempts: 1}
	save("empty body", &empty)
	for _, f := range []struct {
		what     string
		consumer string
		id       uuid.UUID
		body     []byte
		want     int64
	}{
		{"the first", "stock", evID, first.Body, first.ID},
		{"the second", "stock", evID, second.Body, second.ID},
		{"the held one", "stock", evID, held.Body, held.ID},
		{"another body", "stock", evID, []byte("{\"order\":3}"), 0},
		{"a prefix of a body", "stock", evID, first.Body[:len(first.Body)-1], 0},
		{"a longer body", "stock", evID, append(slices.Clone(first.Body), 0), 0},
		{"another consumer", "billing", evID, first.Body, 0},
		{"another event id", "stock", idem.NewEventID(), first.Body, 0},
		{"an empty body", "stock", empty.EventID, []byte{}, empty.ID},
		{"a nil body", "stock", empty.EventID, nil, empty.ID},
	} {
		got, err := d.FindFailed(ctx, ex, f.consumer, f.id, f.body)
		fatalIf(t, err, "find %s", f.what)
		if got != f.want {
			t.Errorf("find %s = %d, want %d", f.what, got, f.want)
		}
	}

	// A save with the second's id: one more failure of that entry, held
	// as the save says; its message stays as first stored.
	again := idem.FailedMessage{
		ID: second.ID, Consumer: "stock", Source: "other.events", EventID: idem.NewEventID(), EventName: "other",
		AggregateType: "customer", AggregateID: "9", Key: []byte("9"), Headers: map[string]string{idem.HeaderRedrive: fmt.Sprint(second.ID)},
		Body: []byte("not the stored body"), Error: "second failure again", Attempts: 2, HeldBy: first.ID,
	}
	id, err := d.SaveFailed(ctx, ex, again)
	fatalIf(t, err, "save with the id of an entry")
	if id != second.ID {
		t.Fatalf("save with the id of entry %d returned %d", second.ID, id)
	}
	second.Error, second.Attempts, second.HeldBy = again.Error, 3, first.ID
	second.History = append(second.History, idem.FailureRecord{Attempt: 2, Error: again.Error})
	check("saved again with its id, held", first, second, held)
	heads("saved again with its id, held", map[idem.AggregateRef]int64{ref("order", "1"): first.ID})
	again.HeldBy, again.Error, again.Attempts = 0, "on its own again", 1
	_, err = d.SaveFailed(ctx, ex, again)
	fatalIf(t, err, "save with the id of an entry, not held")
	second.Error, second.Attempts, second.HeldBy = again.Error, 4, 0
	second.History = append(second.History, idem.FailureRecord{Attempt: 1, Error: again.Error})
	check("saved again with its id, not held", first, second, held)
	heads("saved again with its id, not held", map[idem.AggregateRef]int64{ref("order", "1"): first.ID, ref("order", "2"): second.ID})
	if list, err := fs.List(ctx, idem.FailedFilter{Consumer: "stock"}); err != nil || len(list) != 4 {
		t.Errorf("entries of stock = %d, %v; want 4", len(list), err)
	}

	// The id of another consumer's entry: a new entry of the saving
	// consumer; the other's is untouched.
	billing := idem.FailedMessage{ID: first.ID, Consumer: "billing", EventID: evID, Body: []byte("billing's"), Error: "boom", Attempts: 1}
	id, err = d.SaveFailed(ctx, ex, billing)
	fatalIf(t, err, "save with the id of another consumer's entry")
	if id == first.ID {
		t.Fatalf("a save of billing updated entry %d of stock", first.ID)
	}
	billing.ID = id
	billing.History = []idem.FailureRecord{{Attempt: 1, Error: "boom"}}
	check("another consumer's id", first, billing)

	// The id of an entry that is gone: a new entry, with a new id.
	if ok, err := d.DeleteFailed(ctx, ex, second.ID); err != nil || !ok {
		t.Fatalf("remove entry %d: %v, %v", second.ID, ok, err)
	}
	gone := idem.FailedMessage{ID: second.ID, Consumer: "stock", EventID: evID, AggregateType: "order", AggregateID: "2",
		Body: []byte("after removal"), Error: "after removal", Attempts: 1}
	id, err = d.SaveFailed(ctx, ex, gone)
	fatalIf(t, err, "save with the id of a removed entry")
	if id <= billing.ID {
		t.Fatalf("save with the id of removed entry %d made entry %d; want a new entry, after %d", second.ID, id, billing.ID)
	}
	gone.ID = id
	gone.History = []idem.FailureRecord{{Attempt: 1, Error: "after removal"}}
	check("a removed entry's id", first, held, gone)
}
