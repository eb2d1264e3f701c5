package shopkit

import (
	"context"
	"database/sql"
	"slices"
	"testing"

	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/shop/billing"
	"github.com/idem-go/idem/shop/carrier"
	"github.com/idem-go/idem/shop/order"
	"github.com/idem-go/idem/shop/shipping"
	"github.com/idem-go/idem/shop/stock"
	"github.com/idem-go/idem/shop/store"
)

// TestSubscribers checks the checker's map of who consumes what against
// the shop's services: each consumer's event names, and its service, whose
// database holds its ledger. A consumer or a handler added to the shop
// without the map knowing would have its losses unseen.
func TestSubscribers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	open := func(service string) *store.DB {
		db, err := store.Open(ctx, service, "sqlite:"+dir, "t_"+service, store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(db.Close)
		return db
	}
	client := &carrier.Client{BaseURL: "http://127.0.0.1:1/carrier"}
	got := map[string][]*inbox.Consumer[*sql.Tx]{}
	o, err := order.New(open("order"), order.Config{})
	if err != nil {
		t.Fatal(err)
	}
	got["order"] = append(got["order"], o.Consumer())
	st, err := stock.New(open("stock"), nil)
	if err != nil {
		t.Fatal(err)
	}
	got["stock"] = append(got["stock"], st.Consumer())
	sh, err := shipping.New(open("shipping"), client, shipping.Config{})
	if err != nil {
		t.Fatal(err)
	}
	got["shipping"] = append(got["shipping"], sh.Consumers()...)
	bi, err := billing.New(open("billing"), client, nil)
	if err != nil {
		t.Fatal(err)
	}
	got["billing"] = append(got["billing"], bi.Consumers()...)

	want := map[string][]string{} // consumer -> event names, from subscribers
	for name, cs := range subscribers {
		for _, c := range cs {
			want[c] = append(want[c], name)
		}
	}
	seen := 0
	for service, cs := range got {
		for _, c := range cs {
			seen++
			if consumerDB[c.Name()] != service {
				t.Errorf("consumer %s: its ledger is in the %s database, the checker reads %q", c.Name(), service, consumerDB[c.Name()])
			}
			names := c.EventNames()
			slices.Sort(names)
			w := want[c.Name()]
			slices.Sort(w)
			if !slices.Equal(names, w) {
				t.Errorf("consumer %s handles %v, the checker expects it to apply %v", c.Name(), names, w)
			}
		}
	}
	if seen != len(consumerDB) {
		t.Errorf("the shop has %d consumers, the checker knows %d", seen, len(consumerDB))
	}
}

// TestLedgerProgressWaitsForTheArchive checks that the settle does not end
// while a consumer has applied events its producers do not hold yet: under
// `shop --relay cdc --outbox log` an event is a WAL message, in no table
// until the relay archives it, after the broker confirmed it and maybe
// after a consumer applied it. Checked then, the ledgers would show
// applications of events no outbox holds.
func TestLedgerProgressWaitsForTheArchive(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		expected, applied map[string]int
		want              string
	}{
		{map[string]int{"stock": 3, "order": 2}, map[string]int{"stock": 3, "order": 2}, ""},
		{map[string]int{"stock": 3, "order": 2}, map[string]int{"stock": 2, "order": 2}, "stock 1 not applied"},
		{map[string]int{"stock": 3, "order": 2}, map[string]int{"stock": 3, "order": 3}, "order 1 applied that no outbox holds yet"},
		{map[string]int{"stock": 3}, map[string]int{"stock": 3, "order": 1}, "order 1 applied that no outbox holds yet"},
	} {
		lp := ledgerProgress{recorded: true, expected: tc.expected, applied: tc.applied}
		if got := lp.missing(); got != tc.want || lp.complete() != (tc.want == "") {
			t.Errorf("expected %v, applied %v: missing %q, complete %v; want %q", tc.expected, tc.applied, got, lp.complete(), tc.want)
		}
	}
}
