package main

import (
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
)

// TestBenchCDC runs "bench cdc" small: every part reports, and the
// scratch slots are gone afterwards.
func TestBenchCDC(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	env := map[string]string{"IDEM_DB_URL": testdb.PostgresURL(t), "IDEM_BROKER_URL": testamqp.URL(t)}
	code, out, errOut := runBench(t, env, "cdc", "--rows", "600", "--aggregates", "60", "--runs", "1",
		"--clients", "4", "--commit-duration", "200ms", "--rates", "200", "--rate-duration", "1s")
	if code != 0 {
		t.Fatalf("bench cdc = %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"(a) CDC relay, table rows", "(b) CDC relay, WAL messages", "(c) polling relay", "(d) raw amqp091-go",
		"of raw", "plain insert, no trigger", "outbox with NOTIFY trigger", "outbox without trigger (CDC)", "WAL message (CDC)",
		"200 events/s", "p99"} {
		if !strings.Contains(out, want) {
			t.Errorf("the output lacks %q:\n%s", want, out)
		}
	}
	if n := pg.Count(t, "pg_replication_slots WHERE slot_name LIKE 'idem_bench_cdc_%'"); n != 0 {
		t.Errorf("%d scratch slots left", n)
	}
}

func TestBenchCDCUsage(t *testing.T) {
	t.Parallel()
	code, _, errOut := runBench(t, nil, "cdc", "--db", "postgres://x", "--broker", "kafka://localhost:9092")
	if code != 2 || !strings.Contains(errOut, "bench cdc measures against RabbitMQ") {
		t.Errorf("bench cdc with a Kafka broker = %d %q", code, errOut)
	}
	code, out, _ := runBench(t, nil, "help")
	if code != 0 || !strings.Contains(out, "bench cdc [--db URL]") || !strings.Contains(out, "raw amqp091-go") {
		t.Errorf("help = %d %q", code, out)
	}
}
