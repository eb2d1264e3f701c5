package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
)

// TestBenchBinlog runs "bench binlog" small: every part reports, and the
// scratch database is gone afterwards.
func TestBenchBinlog(t *testing.T) {
	t.Parallel()
	dbURL := testdb.MariaDBURL(t)
	env := map[string]string{"IDEM_DB_URL": dbURL, "IDEM_BROKER_URL": testamqp.URL(t), "IDEM_TEST_DIR": os.Getenv("IDEM_TEST_DIR")}
	code, out, errOut := runBench(t, env, "binlog", "--rows", "600", "--aggregates", "60", "--runs", "1",
		"--clients", "4", "--commit-duration", "200ms", "--rate-duration", "1s", "--rates", "200")
	if code != 0 {
		t.Fatalf("bench binlog = %d\n%s%s", code, out, errOut)
	}
	if errOut != "" {
		t.Logf("standard error:\n%s", errOut)
	}
	for _, want := range []string{"(a) binlog relay", "(b) polling relay", "(c) raw amqp091-go", "of polling", "of raw",
		"CPU ms per 1,000 events: relay", "200 events/s", "read-to-confirm", "receive (1 s resolution)",
		"producer commits/s, 4 clients", "MariaDB with binlog"} {
		if !strings.Contains(out, want) {
			t.Errorf("the output lacks %q:\n%s", want, out)
		}
	}
	db, err := mysql.Open(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME LIKE 'idem\_bench\_binlog\_%'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d scratch databases left", n)
	}
}

func TestBenchBinlogUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"binlog", "--db", "mysql://x", "--broker", "kafka://localhost:9092"}, "bench binlog measures against RabbitMQ"},
		{[]string{"binlog", "--db", "postgres://x", "--broker", "amqp://localhost"}, "bench binlog needs MariaDB"},
		{[]string{"binlog", "--db", "mysql://x", "--broker", "amqp://localhost", "--db-nobinlog", "sqlite:x"}, "--db-nobinlog: want mysql://"},
		{[]string{"binlog", "--db", "mysql://x", "--broker", "amqp://localhost", "--runs", "0"}, "must be positive"},
	} {
		code, _, errOut := runBench(t, nil, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("bench %q = %d %q, want 2 and %q", tc.args, code, errOut, tc.want)
		}
	}
	code, out, _ := runBench(t, nil, "help")
	for _, want := range []string{"bench binlog --db mysql://", "--db-nobinlog", "-cpuprofile", "bench binlog: 50000 unless given"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("help = %d, want %q in\n%s", code, want, out)
		}
	}
}
