package main

import (
	"context"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/internal/tools/shopkit"
)

// TestEndToEndCDC runs the shop on PostgreSQL + RabbitMQ with the CDC relay
// (--relay cdc): orders flow, a SIGTERM and a restart resume from the
// slots, and dropping the namespace drops them.
func TestEndToEndCDC(t *testing.T) {
	t.Parallel()
	endToEndCDC(t, outboxRows)
}

// TestEndToEndCDCWALMessages runs the shop with the CDC relay and its
// events written as WAL messages (--outbox log): no outbox row ever.
func TestEndToEndCDCWALMessages(t *testing.T) {
	t.Parallel()
	endToEndCDC(t, outboxLog)
}

func endToEndCDC(t *testing.T, outboxMode string) {
	pg, amqpURL := testdb.PostgresURL(t), testamqp.URL(t)
	ns := "e2ecdc_" + outboxMode + "_" + shopkit.RandomSuffix()
	in, err := shopkit.OpenInspector(context.Background(), pg, ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		in.DropNamespace()
		var left int
		if err := in.DBs["order"].SQL.QueryRow(`SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE $1`, "idem_"+ns+"_%").Scan(&left); err != nil {
			t.Error(err)
		} else if left != 0 {
			t.Errorf("%d replication slots of namespace %s left after dropNamespace", left, ns)
		}
		in.Close()
	})
	admin, err := shopkit.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	banner := endToEnd(t, &shopkit.Cluster{Binary: shopBinary, DB: pg, Broker: amqpURL, Namespace: ns, LogDir: t.TempDir(), Relay: relayCDC, Outbox: outboxMode,
		ExtraEnv: []string{"SHOP_ADMIN_ADDR=" + admin}}, in)
	// The running shop's admin address serves each CDC relay's metrics.
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, s := range []string{"order", "shipping", "billing"} {
		for _, m := range []string{"idem_cdc_slot_lag_bytes", "idem_cdc_streaming", "idem_cdc_published_total"} {
			if want := m + `{slot="idem_` + ns + "_" + s + `_outbox"}`; !strings.Contains(string(body), want) {
				t.Errorf("/metrics lacks %s", want)
			}
		}
	}
	if outboxMode == outboxLog {
		var rows int
		for _, s := range []string{"order", "shipping", "billing"} {
			n, err := in.DBs[s].Count(context.Background(), `SELECT count(*) FROM outbox`)
			if err != nil {
				t.Fatal(err)
			}
			rows += int(n)
		}
		if rows != 0 || !strings.Contains(banner, "WAL messages") {
			t.Errorf("--outbox log: %d outbox rows, banner:\n%s", rows, banner)
		}
	}
	if !strings.Contains(banner, "CDC") || !strings.Contains(banner, "idem_"+ns+"_order_outbox") {
		t.Errorf("the banner does not name the CDC relay and its slots:\n%s", banner)
	}
	var slots int
	if err := in.DBs["order"].SQL.QueryRow(`SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE $1`, "idem_"+ns+"_%").Scan(&slots); err != nil {
		t.Fatal(err)
	}
	if slots != 3 {
		t.Errorf("%d replication slots for namespace %s, want 3 (order, shipping, billing)", slots, ns)
	}
	for _, s := range []string{"order", "shipping", "billing"} {
		testsvc.WaitFor(t, 20*time.Second, s+": every published outbox row deleted", func() bool {
			n, err := in.DBs[s].Count(context.Background(), `SELECT count(*) FROM outbox`)
			return err == nil && n == 0
		})
	}
}

// TestRelayCDCNeedsPostgres: --relay cdc on another database fails at once
// and says what to do.
func TestRelayCDCNeedsPostgres(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(shopBinary, "--relay", "cdc", "--services", "relay", "--data-dir", t.TempDir(), "--summary", "0").CombinedOutput()
	if err == nil {
		t.Fatalf("shop --relay cdc on SQLite started:\n%s", out)
	}
	for _, want := range []string{"CDC relay", "PostgreSQL", "--relay poll"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the error does not mention %q:\n%s", want, out)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--relay", "kafka-connect"}, `--relay "kafka-connect": want poll or cdc`},
		{[]string{"--outbox", "log"}, "--outbox log needs --relay cdc"},
		{[]string{"--outbox", "table"}, `--outbox "table": want rows or log`},
	} {
		out, err := exec.Command(shopBinary, append(tc.args, "--data-dir", t.TempDir())...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("shop %v: %v\n%s", tc.args, err, out)
		}
	}
}
