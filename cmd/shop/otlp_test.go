package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/telemetry/telemetrytest"
	"github.com/idem-go/idem/internal/tools/shopkit"
	"github.com/idem-go/idem/shop"
	"github.com/idem-go/idem/shop/billing"
	"github.com/idem-go/idem/shop/shipping"
	"github.com/idem-go/idem/shop/stock"
)

// TestShopExportsTracesOverOTLP runs the shop command on its embedded
// defaults with OTEL_EXPORTER_OTLP_ENDPOINT set to a test receiver, places
// an order carrying a traceparent, and checks that the process exports the
// order's trace: the API's server span under the caller's span, the relay's
// send span and the three consumers' process spans under the server span.
func TestShopExportsTracesOverOTLP(t *testing.T) {
	t.Parallel()
	r := telemetrytest.NewReceiver(t)
	cl := &shopkit.Cluster{Binary: shopBinary, DataDir: t.TempDir(), LogDir: t.TempDir(),
		ExtraEnv: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + r.URL, "OTEL_BSP_SCHEDULE_DELAY=100", "OTEL_SERVICE_NAME="}}
	t.Cleanup(cl.StopAll)
	p, err := cl.Start(context.Background(), shopkit.ProcSpec{Name: "shop", Services: "all"})
	if err != nil {
		t.Fatal(err)
	}

	traceID, callerID := randomHex(16), randomHex(8)
	body := `{"customer_id":"c-otlp","lines":[{"product_id":"p-1","quantity":"1.000"}]}`
	req, err := http.NewRequest(http.MethodPost, "http://"+p.HTTP+"/orders", bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+traceID+"-"+callerID+"-01")
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /orders: %d %s", resp.StatusCode, b)
	}

	consumers := []string{stock.ConsumerName, shipping.PreparationConsumer, billing.InvoiceConsumer}
	r.Wait(t, 60*time.Second, "complete trace of the order", func(all []telemetrytest.Span) bool {
		var server string
		for _, s := range all {
			if s.TraceID == traceID && s.Kind == "server" && s.ParentSpanID == callerID && s.Service == "shop" {
				server = s.SpanID
			}
		}
		if server == "" {
			return false
		}
		sent, processed := false, map[string]bool{}
		for _, s := range all {
			if s.TraceID != traceID || s.ParentSpanID != server || s.Attributes["idem.event.name"] != shop.OrderPlaced ||
				s.Attributes["messaging.system"] != "nats" {
				continue
			}
			switch s.Kind {
			case "producer":
				sent = true
			case "consumer":
				if s.Attributes["idem.outcome"] == "applied" {
					processed[s.Attributes["messaging.consumer.group.name"]] = true
				}
			}
		}
		for _, c := range consumers {
			if !processed[c] {
				return false
			}
		}
		return sent
	})
	if err := p.Stop(); err != nil {
		t.Fatalf("SIGTERM: %v\n%s", err, p.Tail())
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
