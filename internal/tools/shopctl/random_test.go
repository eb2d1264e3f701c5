package main

import (
	"cmp"
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testkafka"
	"github.com/idem-go/idem/internal/testnatscluster"
	"github.com/idem-go/idem/internal/tools/shopkit"
)

// shortRandom sets the pace of the random runs of the tests: every target
// faulted at least once (MinRounds), the active relay included.
func shortRandom(t *testing.T, o randomOptions) randomOptions {
	t.Helper()
	if o.Binary == "" {
		o.Binary = shopBinary
	}
	o.LogDir = t.TempDir()
	o.Rate, o.KillMin, o.KillMax, o.MinRounds = cmp.Or(o.Rate, 15), 300*time.Millisecond, 1500*time.Millisecond, 1
	o.FreezeMin, o.FreezeMax = randomDefaults.FreezeMin, randomDefaults.FreezeMax
	if o.Settle == 0 {
		o.Settle = 2 * time.Minute
	}
	o.Seed = uint64(time.Now().UnixNano())
	return o
}

// runShort runs a short random run and logs its report.
func runShort(t *testing.T, o randomOptions) randomReport {
	t.Helper()
	rep, err := runRandom(context.Background(), o)
	var b strings.Builder
	printRandom(&b, rep)
	t.Log("\n" + b.String())
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// checkRandom runs a short random run and fails on any failed check, and
// on a check that did not run.
func checkRandom(t *testing.T, o randomOptions) {
	t.Helper()
	o = shortRandom(t, o)
	o.Strict = true
	rep := runShort(t, o)
	if n := rep.failed(); n > 0 {
		t.Errorf("%d of %d checks failed or did not run (seed %d)", n, len(rep.Checks), o.Seed)
	}
	if len(rep.Checks) < 11 {
		t.Errorf("%d checks ran, want 11", len(rep.Checks))
	}
	if rep.Accepted < 100 || len(rep.Faults) < 10 || rep.Replayed == 0 {
		t.Errorf("%d orders accepted, %d faults, %d events replayed: too few to tell anything", rep.Accepted, len(rep.Faults), rep.Replayed)
	}
}

// TestChaosRandomCDC faults the shop's processes at random under load on
// PostgreSQL + RabbitMQ with the CDC relay, two replicas of each service
// (the second of each consumer standing by), and the PostgreSQL server,
// one of the test's own: killed with SIGKILL and started again, frozen,
// and its commits held after their WAL flush (when the relay reads them
// and before they are visible).
func TestChaosRandomCDC(t *testing.T) {
	t.Parallel()
	srv := testdb.StartServer(t, "max_connections = 400")
	db := &shopkit.DBServer{URL: srv.URL, Start: srv.StartCommand()}
	checkRandom(t, randomOptions{DB: srv.URL, Broker: testamqp.URL(t), Relay: shopkit.RelayCDC, Replicas: 2, Duration: 20 * time.Second,
		Servers: []serverTarget{serverDB(db)}})
}

// TestChaosRandomEmbedded does the same on the embedded defaults: SQLite
// files shared by the processes and a NATS JetStream server run as a
// process of its own (shop broker), killed and frozen too, with the
// polling relay, two replicas of each service sharing 4 partitions of the
// stream. Its order check found 116 events applied before an earlier one
// of their aggregate in a 40 s run on the build before the consumers'
// ownership. Thirteen processes share the SQLite files' one write lock,
// and the broker is the shop binary built with -race: its acknowledgements
// can outlast the relays' publish timeout (a third of their 2 s lease),
// and a relay that times out gives its whole batch back. 6 orders a
// second for 20 s, and 3 minutes to settle, keep it within what 2 loaded
// cores do (docs/RELIABILITY.md).
func TestChaosRandomEmbedded(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	checkRandom(t, randomOptions{DB: "sqlite:" + filepath.Join(dir, "db"), BrokerDir: dir, Replicas: 2, Partitions: 4, Duration: 20 * time.Second,
		Rate: 6, Settle: 3 * time.Minute})
}

// TestChaosRandomNATSCluster runs the shop on PostgreSQL with the polling
// relay and a NATS JetStream cluster of three nats-server processes (the
// stream kept on all three: replicas=3), two replicas of each service
// sharing 4 partitions; each server of the cluster is killed with SIGKILL
// and started again, or frozen, in turn with the shop's processes.
func TestChaosRandomNATSCluster(t *testing.T) {
	t.Parallel()
	c := testnatscluster.Start(t, testnatscluster.Config{ReadyTimeout: 3 * time.Minute})
	var nodes []serverTarget
	for i := range c.Servers() {
		nodes = append(nodes, serverTarget{Name: c.Name(i),
			Crash: func(context.Context) (string, error) {
				// Started again once current with the meta leader, not
				// once healthy: the consumers the shop's processes update
				// as they restart can leave one without its replica on
				// the restarted server, unhealthy for minutes (a
				// nats-server fault); it runs on the two others. Fails
				// the test on error; called from the test's goroutine.
				c.RestartMetaCurrent(i)
				return "SIGKILL, started again", nil
			},
			Freeze: func() error { c.Freeze(i); return nil },
			Thaw:   func() error { c.Thaw(i); return nil },
		})
	}
	checkRandom(t, randomOptions{DB: testdb.PostgresURL(t), Broker: c.URL() + "?replicas=3&ack_wait=3s", Replicas: 2, Partitions: 4, Duration: 15 * time.Second,
		Servers: nodes})
}

// TestChaosRandomMariaDBKafka runs the stack of the second article:
// MariaDB, one database per service, with the binlog relay (shop --relay
// cdc), and Kafka (kfake on a TCP port), two replicas of each service; the
// MariaDB server, one of the test's own, killed with SIGKILL and started
// again, frozen, and its commits held after the binary log has them and
// before InnoDB commits them.
func TestChaosRandomMariaDBKafka(t *testing.T) {
	t.Parallel()
	// The shared server's settings: its binary log, and connections
	// for two replicas of five services, their relays and the checker.
	srv := testdb.StartMariaDB(t, slices.Concat(testdb.SharedBinlog,
		[]string{"character-set-server = utf8mb4", "collation-server = utf8mb4_general_ci", "max_connections = 500", "innodb_buffer_pool_size = 64M"})...)
	db := &shopkit.DBServer{URL: srv.URL, Start: srv.StartCommand()}
	checkRandom(t, randomOptions{DB: srv.URL, Broker: testkafka.Start(t) + "?session_timeout=6s", Relay: shopkit.RelayCDC, Replicas: 2, Duration: 15 * time.Second,
		Servers: []serverTarget{serverDB(db)}})
}
