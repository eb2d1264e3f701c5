package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/tools/shopkit"
)

// TestCancelEmbedded cancels orders on the embedded defaults: one whose
// pickup was requested already, one just placed.
func TestCancelEmbedded(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	in, err := shopkit.OpenInspector(context.Background(), "sqlite:"+dir, namespaceDefault)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(in.Close)
	cancelFlow(t, &shopkit.Cluster{Binary: shopBinary, DataDir: dir, LogDir: t.TempDir()}, in)
}

// TestCancelPostgresRabbitMQ is TestCancelEmbedded on PostgreSQL +
// RabbitMQ, where the pickup request and the cancellation take row locks.
func TestCancelPostgresRabbitMQ(t *testing.T) {
	t.Parallel()
	pg, amqpURL := testdb.PostgresURL(t), testamqp.URL(t)
	ns := "cancel_" + shopkit.RandomSuffix()
	in, err := shopkit.OpenInspector(context.Background(), pg, ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.DropNamespace(); in.Close() })
	cancelFlow(t, &shopkit.Cluster{Binary: shopBinary, DB: pg, Broker: amqpURL, Namespace: ns, LogDir: t.TempDir()}, in)
}

// TestCancelMariaDB is TestCancelEmbedded on MariaDB (one database per
// service) with the embedded NATS JetStream broker.
func TestCancelMariaDB(t *testing.T) {
	t.Parallel()
	my := testdb.MariaDBURL(t)
	ns := "cancel_" + shopkit.RandomSuffix()
	in, err := shopkit.OpenInspector(context.Background(), my, ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.DropNamespace(); in.Close() })
	cancelFlow(t, &shopkit.Cluster{Binary: shopBinary, DB: my, Namespace: ns, DataDir: t.TempDir(), LogDir: t.TempDir()}, in)
}

// cancelFlow starts the shop as one process, cancels an order after its
// pickup was requested and another right after it was placed, and waits
// until every service has compensated: the orders' fulfilments are final,
// their reservations released, their invoices voided (and the customer
// told if the invoice was e-mailed), and no pickup stands at the carrier.
func cancelFlow(t *testing.T, cl *shopkit.Cluster, in *shopkit.Inspector) {
	t.Helper()
	t.Cleanup(cl.StopAll)
	ctx := context.Background()
	p, err := cl.Start(ctx, shopkit.ProcSpec{Name: "shop", Services: "all"})
	if err != nil {
		t.Fatal(err)
	}
	shipped, err := shopkit.PlaceOK(ctx, p.HTTP, "c-shipped", 2)
	if err != nil {
		t.Fatal(err)
	}
	waitOrder(t, p.HTTP, shipped, func(o orderView) bool { return o.Fulfilment == "shipment requested" })
	fresh, err := shopkit.PlaceOK(ctx, p.HTTP, "c-fresh", 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{fresh, shipped} {
		var o orderView
		if status, err := postOrder(ctx, "http://"+p.HTTP+"/orders/"+id+"/cancel", &o); err != nil || status != http.StatusOK || o.Status != "cancelled" {
			t.Fatalf("cancel %s: %d %+v %v", id, status, o, err)
		}
	}
	waitOrder(t, p.HTTP, shipped, func(o orderView) bool { return o.Fulfilment == "shipment cancelled" && o.PickupID != "" })
	waitOrder(t, p.HTTP, fresh, func(o orderView) bool { return o.Fulfilment == "cancelled" || o.Fulfilment == "shipment cancelled" })

	ids := "'" + shipped + "','" + fresh + "'"
	checks := []struct {
		service, what, query string
		want                 int64
	}{
		{"stock", "reservations held", `SELECT count(*) FROM reservation WHERE released_at IS NULL AND order_id IN (` + ids + `)`, 0},
		{"stock", "reservations released", `SELECT count(*) FROM reservation WHERE released_at IS NOT NULL AND order_id IN (` + ids + `)`, 5},
		{"billing", "invoices voided", `SELECT count(*) FROM invoice WHERE voided_at IS NOT NULL AND order_id IN (` + ids + `)`, 2},
		{"billing", "invoices e-mailed and not told void", `SELECT count(*) FROM invoice WHERE email_id IS NOT NULL AND void_email_id IS NULL AND order_id IN (` + ids + `)`, 0},
		{"carrier", "pickups standing", `SELECT count(*) FROM pickup WHERE cancelled_at IS NULL AND reference IN (` + ids + `)`, 0},
		{"carrier", "pickups cancelled with shipment:<id>:cancel", `SELECT count(*) FROM pickup WHERE cancel_key = 'shipment:` + shipped + `:cancel'`, 1},
		{"shipping", "shipments not cancelled", `SELECT count(*) FROM shipment WHERE cancelled_at IS NULL AND order_id IN (` + ids + `)`, 0},
		{"shipping", "active preparations", `SELECT count(*) FROM preparation WHERE status = 'active' AND order_id IN (` + ids + `)`, 0},
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var wrong []string
		for _, c := range checks {
			n, err := in.DBs[c.service].Count(ctx, c.query)
			if err != nil {
				t.Fatalf("%s: %v", c.service, err)
			}
			if n != c.want {
				wrong = append(wrong, fmt.Sprintf("%s: %d %s, want %d", c.service, n, c.what, c.want))
			}
		}
		if len(wrong) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30s: %s\n%s", strings.Join(wrong, "; "), p.Tail())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// orderView is an order as GET /orders/{id} shows it.
type orderView struct {
	Status, Fulfilment string
	PickupID           string `json:"pickup_id"`
}

// waitOrder polls an order until ok says yes.
func waitOrder(t *testing.T, addr, id string, ok func(orderView) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var o orderView
		err := shopkit.GetJSON(context.Background(), "http://"+addr+"/orders/"+id, &o)
		if err == nil && ok(o) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("order %s after 30s: %+v (err %v)", id, o, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// postOrder posts to url with no body and decodes the answer into o.
func postOrder(ctx context.Context, url string, o *orderView) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return resp.StatusCode, json.NewDecoder(resp.Body).Decode(o)
}
