package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/tools/shopkit"
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
	if len(rep.Checks) < 6 {
		t.Errorf("%d checks ran, want 6", len(rep.Checks))
	}
	if rep.Accepted < 100 || sumKills(rep.Kills) < o.MinKills {
		t.Errorf("%d orders accepted and %d kills: too few to tell anything", rep.Accepted, sumKills(rep.Kills))
	}
}

// TestChaosRandomCDC kills the shop's processes at random under load on
// PostgreSQL + RabbitMQ with the CDC relay, two replicas of each service
// (the second of each consumer standing by): nothing parked, nothing
// missing, every invoice marked e-mailed (a consumer acting on an event
// before its producer's transaction was visible would park or miss it).
func TestChaosRandomCDC(t *testing.T) {
	t.Parallel()
	checkRandom(t, randomOptions{DB: testdb.PostgresURL(t), Broker: testamqp.URL(t), Relay: shopkit.RelayCDC, Replicas: 2, Duration: 20 * time.Second})
}

// TestChaosRandomEmbedded does the same on the embedded defaults: SQLite
// files shared by the processes and a NATS JetStream server run as a
// process of its own (shop broker), killed at random too, with the polling
// relay, two replicas of each service sharing 4 partitions of the stream.
// Its order check fails on the build before the consumers' ownership (116
// events applied before an earlier one of their aggregate in a 40 s run).
func TestChaosRandomEmbedded(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	checkRandom(t, randomOptions{DB: "sqlite:" + filepath.Join(dir, "db"), BrokerDir: dir, Replicas: 2, Partitions: 4, Duration: 15 * time.Second})
}
