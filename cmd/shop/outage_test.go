package main

import (
	"context"
	"fmt"
	"github.com/idem-go/idem/internal/tools/shopkit"
	"testing"
	"time"
)

// TestCarrierOutage splits the shop in two processes, "order,carrier" and
// the rest, on the embedded defaults, and stops the first for 20 seconds
// while the events of orders placed just before are on their way: shipping
// and billing meet a carrier that refuses connections. Nothing is parked,
// and once the carrier is back every order gets its pickup and its e-mail,
// once.
func TestCarrierOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	db, brokerURL, stop, err := shopkit.StartEmbedded(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	in, err := shopkit.OpenInspector(ctx, db, namespaceDefault)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(in.Close)
	cl := &shopkit.Cluster{Binary: shopBinary, DB: db, Broker: brokerURL, LogDir: t.TempDir()}
	t.Cleanup(cl.StopAll)
	front, err := cl.Start(ctx, shopkit.ProcSpec{Name: "front", Services: "order,carrier"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Start(ctx, shopkit.ProcSpec{Name: "back", Services: "stock,shipping,billing,relay", CarrierURL: "http://" + front.HTTP + "/carrier"}); err != nil {
		t.Fatal(err)
	}
	const orders = 20
	for i := range orders {
		if _, err := shopkit.PlaceOK(ctx, front.HTTP, fmt.Sprintf("c-%d", i), 2); err != nil {
			t.Fatal(err)
		}
	}
	if err := front.Stop(); err != nil {
		t.Fatalf("stop the carrier: %v\n%s", err, front.Tail())
	}
	time.Sleep(20 * time.Second) // the carrier is away
	if _, err := cl.Start(ctx, shopkit.ProcSpec{Name: "front", Services: "order,carrier", HTTP: front.HTTP}); err != nil {
		t.Fatal(err)
	}
	if obs, ok := in.Settle(ctx, shopkit.SettleTimeout, orders); !ok {
		t.Fatal(obs)
	}
	for _, s := range databases {
		n, err := in.DBs[s].Count(ctx, `SELECT count(*) FROM failed_message`)
		if err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("%s: %d message(s) parked by a carrier outage; want none", s, n)
		}
	}
}
