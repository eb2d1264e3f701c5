package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
)

// checkRandom runs a short random-kill run and fails on any failed check.
func checkRandom(t *testing.T, o randomOptions) {
	t.Helper()
	o.Binary, o.LogDir = shopBinary, t.TempDir()
	o.Rate, o.KillMin, o.KillMax, o.Settle, o.MinKills = 15, 500*time.Millisecond, 3*time.Second, 2*time.Minute, 4
	o.Seed = uint64(time.Now().UnixNano())
	rep, err := runRandom(context.Background(), o)
	var b strings.Builder
	printRandom(&b, rep)
	t.Log("\n" + b.String())
	if err != nil {
		t.Fatal(err)
	}
	if n := rep.failed(); n > 0 {
		t.Errorf("%d of %d checks failed (seed %d)", n, len(rep.Checks), o.Seed)
	}
	if len(rep.Checks) < 5 {
		t.Errorf("%d checks ran, want 5", len(rep.Checks))
	}
	if rep.Accepted < 100 || sumKills(rep.Kills) < o.MinKills {
		t.Errorf("%d orders accepted and %d kills: too few to tell anything", rep.Accepted, sumKills(rep.Kills))
	}
}

// TestChaosRandomCDC kills the shop's processes at random under load on
// PostgreSQL + RabbitMQ with the CDC relay: nothing parked, nothing
// missing, every invoice marked e-mailed (a consumer acting on an event
// before its producer's transaction was visible would park or miss it).
func TestChaosRandomCDC(t *testing.T) {
	t.Parallel()
	checkRandom(t, randomOptions{DB: testdb.PostgresURL(t), Broker: testamqp.URL(t), Relay: relayCDC, Duration: 20 * time.Second})
}

// TestChaosRandomEmbedded does the same on the embedded defaults: SQLite
// files shared by the processes and a NATS JetStream server run by the
// test, with the polling relay.
func TestChaosRandomEmbedded(t *testing.T) {
	t.Parallel()
	db, brokerURL, stop, err := embeddedChaos(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	checkRandom(t, randomOptions{DB: db, Broker: brokerURL, Duration: 15 * time.Second})
}
