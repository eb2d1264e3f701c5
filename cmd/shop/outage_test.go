package main

import (
	"context"
	"fmt"
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
	db, brokerURL, stop, err := embeddedChaos(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	in, err := openInspector(ctx, db, namespaceDefault)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(in.close)
	cl := &cluster{binary: shopBinary, db: db, broker: brokerURL, logDir: t.TempDir()}
	t.Cleanup(cl.stopAll)
	front, err := cl.start(ctx, procSpec{name: "front", services: "order,carrier"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.start(ctx, procSpec{name: "back", services: "stock,shipping,billing,relay", carrierURL: "http://" + front.http + "/carrier"}); err != nil {
		t.Fatal(err)
	}
	const orders = 20
	for i := range orders {
		if _, err := placeOK(ctx, front.http, fmt.Sprintf("c-%d", i), 2); err != nil {
			t.Fatal(err)
		}
	}
	if err := front.stop(); err != nil {
		t.Fatalf("stop the carrier: %v\n%s", err, front.tail())
	}
	time.Sleep(20 * time.Second) // the carrier is away
	if _, err := cl.start(ctx, procSpec{name: "front", services: "order,carrier", http: front.http}); err != nil {
		t.Fatal(err)
	}
	if obs, ok := in.settle(ctx, settleTimeout, orders); !ok {
		t.Fatal(obs)
	}
	for _, s := range databases {
		n, err := in.dbs[s].Count(ctx, `SELECT count(*) FROM failed_message`)
		if err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("%s: %d message(s) parked by a carrier outage; want none", s, n)
		}
	}
}
