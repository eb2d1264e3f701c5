package main

import (
	"context"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testkafka"
	"github.com/idem-go/idem/internal/tools/shopkit"
)

// TestChaosPostgresRabbitMQ runs the whole crash table on PostgreSQL +
// RabbitMQ with real processes killed at named fault points.
func TestChaosPostgresRabbitMQ(t *testing.T) {
	t.Parallel()
	pg, amqpURL := testdb.PostgresURL(t), testamqp.URL(t)
	results := runChaos(context.Background(), chaosOptions{Binary: shopBinary, DB: pg, Broker: amqpURL, LogDir: t.TempDir()})
	// Every case, the CDC relay's included.
	checkChaos(t, results, len(chaosCases))
}

// chaosSubset are the cases run on PostgreSQL + Kafka, while the embedded
// defaults, PostgreSQL + RabbitMQ and MariaDB + Kafka run the whole table:
// one per source of duplicates that depends on the transport (relay
// republish, broker redelivery after a commit) and the external effect
// (carrier answer lost). The whole table on every combination would take
// the package past its time budget.
const chaosSubset = "relay.after-publish-before-mark,inbox.after-commit-before-ack,carrier answer lost"

func checkChaos(t *testing.T, results []chaosResult, want int) {
	t.Helper()
	var b strings.Builder
	failed := printTable(&b, results)
	t.Log("\n" + b.String())
	if failed > 0 {
		t.Errorf("%d of %d cases failed", failed, len(results))
	}
	if len(results) != want {
		t.Errorf("%d cases ran, want %d", len(results), want)
	}
}

// TestChaosEmbedded runs the whole crash table on the embedded defaults:
// SQLite files shared by the shop processes, and a NATS JetStream server run
// by the test (the processes it kills cannot own it). JetStream drops a copy
// published again with the same Nats-Msg-Id within its duplicate window, so
// the relay's republish and the replays are mostly absorbed by the broker
// here; the consumers' dedup is still exercised by the redelivery after a
// commit.
func TestChaosEmbedded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, brokerURL, stop, err := shopkit.StartEmbedded(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	results := runChaos(ctx, chaosOptions{Binary: shopBinary, DB: db, Broker: brokerURL, LogDir: t.TempDir()})
	// Every case but the CDC relay's, which needs PostgreSQL or MariaDB.
	checkChaos(t, results, applicableCases(db))
}

// TestChaosPostgresKafka runs chaosSubset on PostgreSQL + Kafka. Kafka is
// franz-go's in-process kfake cluster, listening on a TCP port so that the
// shop processes can reach it; topics are created on first use.
func TestChaosPostgresKafka(t *testing.T) {
	t.Parallel()
	pg := testdb.PostgresURL(t)
	kafkaURL := testkafka.Start(t)
	results := runChaos(context.Background(), chaosOptions{
		Binary: shopBinary, DB: pg, Broker: kafkaURL + "?session_timeout=6s", Only: chaosSubset, LogDir: t.TempDir(),
	})
	checkChaos(t, results, 3)
}

// TestChaosMariaDBKafka runs the crash table on the stack of the second
// article: MariaDB (one database per service) + Kafka, every case but the
// one of WAL messages (PostgreSQL's): the CDC relay's cases read MariaDB's
// binary log. Kafka is kfake listening on a TCP
// port, as in TestChaosPostgresKafka.
func TestChaosMariaDBKafka(t *testing.T) {
	t.Parallel()
	my := testdb.MariaDBURL(t)
	kafkaURL := testkafka.Start(t)
	results := runChaos(context.Background(), chaosOptions{
		Binary: shopBinary, DB: my, Broker: kafkaURL + "?session_timeout=6s", LogDir: t.TempDir(),
	})
	checkChaos(t, results, applicableCases(my))
}
