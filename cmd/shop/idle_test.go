package main

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestIdleShopWakesItsRelays: on the embedded defaults, the relays of an
// idle shop back off to relayMaxPollInProcess between polls, and an order
// placed then still reaches "in preparation" at once, through two relays
// that the order API and the shipping consumer wake. Were they not woken,
// each relay would find its row at its next poll, seconds later.
func TestIdleShopWakesItsRelays(t *testing.T) {
	t.Parallel()
	cl := &cluster{binary: shopBinary, dataDir: t.TempDir(), logDir: t.TempDir()}
	t.Cleanup(cl.stopAll)
	ctx := context.Background()
	p, err := cl.start(ctx, procSpec{name: "shop", services: "all"})
	if err != nil {
		t.Fatal(err)
	}
	id, err := placeOK(ctx, p.http, "c-warm", 1)
	if err != nil {
		t.Fatal(err)
	}
	waitFulfilment(t, p.http, id)

	// Idle long enough for the relays to reach their longest poll interval
	// (50 ms doubled to 5 s takes about 6.4 s of empty claims).
	time.Sleep(relayMaxPollInProcess + 3*time.Second)

	const bound = relayMaxPollInProcess / 2
	for i := range 3 {
		start := time.Now()
		id, err := placeOK(ctx, p.http, fmt.Sprintf("c-idle-%d", i), 1)
		if err != nil {
			t.Fatal(err)
		}
		for {
			var o orderView
			err := getJSON(ctx, "http://"+p.http+"/orders/"+id, &o)
			if err == nil && (o.Fulfilment == "in preparation" || o.Fulfilment == "shipment requested") {
				break
			}
			if d := time.Since(start); d > bound {
				t.Fatalf("order %d: fulfilment %q %v after it was placed on an idle shop; want it within %v (err %v)\n%s",
					i, o.Fulfilment, d, bound, err, p.tail())
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Logf("order %d in preparation %v after it was placed", i, time.Since(start).Round(time.Millisecond))
		time.Sleep(time.Second)
	}
}
