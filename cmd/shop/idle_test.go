package main

import (
	"context"
	"fmt"
	"github.com/idem-go/idem/internal/tools/shopkit"
	"strings"
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
	admin, err := shopkit.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	cl := &shopkit.Cluster{Binary: shopBinary, DataDir: t.TempDir(), LogDir: t.TempDir(), ExtraEnv: []string{"SHOP_ADMIN_ADDR=" + admin}}
	t.Cleanup(cl.StopAll)
	ctx := context.Background()
	// publishErrors reads the rows whose publication failed, from the
	// relays' metrics: a counter, where a log line of the failure may be
	// only counted (package errlog).
	publishErrors := func() float64 {
		t.Helper()
		_, body, err := adminGet(ctx, "http://"+admin+"/metrics")
		if err != nil {
			t.Fatal(err)
		}
		m, err := shopkit.ParseMetrics(strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		return m["idem_relay_publish_errors_total"]
	}
	p, err := cl.Start(ctx, shopkit.ProcSpec{Name: "shop", Services: "all"})
	if err != nil {
		t.Fatal(err)
	}
	id, err := shopkit.PlaceOK(ctx, p.HTTP, "c-warm", 1)
	if err != nil {
		t.Fatal(err)
	}
	waitFulfilment(t, p.HTTP, id)

	// idle waits long enough for the relays to reach their longest poll
	// interval (50 ms doubled to 5 s takes about 6.4 s of empty claims).
	idle := func() { time.Sleep(relayMaxPollInProcess + 3*time.Second) }
	idle()

	// An order that is late because a publish failed (the embedded
	// server's disk sync stalled past the relay's publish timeout on a
	// loaded machine once) tells nothing about wake-ups: the relays count
	// the rows whose publication failed, and the shop idles again for
	// another order. A late order with no such failure fails the test, as
	// every order would were the relays not woken.
	const (
		bound   = relayMaxPollInProcess / 2
		orders  = 3
		excused = 2
	)
	for i, woken := 0, 0; woken < orders; i++ {
		if i == orders+excused {
			t.Fatalf("%d of %d orders were delayed by broker failures; cannot tell whether the relays are woken\n%s", i-woken, i, p.Problems())
		}
		logBefore, errorsBefore := len(p.LogText()), publishErrors()
		start := time.Now()
		id, err := shopkit.PlaceOK(ctx, p.HTTP, fmt.Sprintf("c-idle-%d", i), 1)
		if err != nil {
			t.Fatal(err)
		}
		late := false
		for {
			if ok, _, _ := preparing(ctx, p.HTTP, id); ok {
				break
			}
			d := time.Since(start)
			if d > bound && !late {
				late = true
				t.Logf("order %d not in preparation %v after it was placed on an idle shop; want it within %v", i, d.Round(time.Millisecond), bound)
			}
			if d > time.Minute {
				t.Fatalf("order %d not in preparation after %v\n%s", i, d, p.Tail())
			}
			time.Sleep(5 * time.Millisecond)
		}
		d := time.Since(start)
		if !late {
			t.Logf("order %d in preparation %v after it was placed", i, d.Round(time.Millisecond))
			woken++
			time.Sleep(time.Second)
			continue
		}
		since := p.LogText()[logBefore:]
		if publishErrors() == errorsBefore {
			t.Fatalf("order %d in preparation %v after it was placed on an idle shop, with no failed publication; want it within %v\n%s",
				i, d.Round(time.Millisecond), bound, since)
		}
		t.Logf("order %d in preparation after %v, delayed by a failed publication; idling again:\n%s", i, d.Round(time.Millisecond), shopkit.ProblemLines(since))
		idle()
	}
}
