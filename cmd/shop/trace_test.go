package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/tools/shopkit"
	"github.com/idem-go/idem/shop"
	"github.com/idem-go/idem/shop/billing"
	"github.com/idem-go/idem/shop/order"
	"github.com/idem-go/idem/shop/shipping"
	"github.com/idem-go/idem/shop/stock"
)

var (
	tracingOnce sync.Once
	spans       *tracetest.InMemoryExporter
)

// installTracing makes the process's global tracer provider an SDK one that
// records every span in memory, as telemetry.Setup does with an exporter,
// once for the package's tests (the binary the other tests run is another
// process). Tests find their spans by trace id.
func installTracing() *tracetest.InMemoryExporter {
	tracingOnce.Do(func() {
		spans = tracetest.NewInMemoryExporter()
		otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans)))
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	})
	return spans
}

// TestTraceThroughTheShop places an order, in a client span, on the shop's
// services run in this process, on PostgreSQL and each transport, and checks
// that one trace links the client, the order API's server span, the relay's
// send span and every consumer's process span, then on through the events
// the consumers write: shipping's preparation to the order service and the
// carrier pickup, billing's invoice to the mailer.
func TestTraceThroughTheShop(t *testing.T) {
	t.Parallel()
	exporter := installTracing()
	pg := testdb.PostgresURL(t)
	transports := []struct {
		name, system string
		broker       func(t *testing.T) string
	}{
		{"RabbitMQ", "rabbitmq", func(t *testing.T) string { return testamqp.URL(t) }},
		{"Kafka", "kafka", func(t *testing.T) string {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(2))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			return "kafka://" + c.ListenAddrs()[0]
		}},
		{"NATS", "nats", func(t *testing.T) string { return embeddedBrokerURL(t.TempDir()) }},
	}
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			addr, err := shopkit.FreeAddr()
			if err != nil {
				t.Fatal(err)
			}
			cfg := runConfig{
				Services: allServices, DB: pg, ServiceDB: map[string]string{}, Broker: tr.broker(t), HTTP: addr,
				Namespace: "trace_" + shopkit.RandomSuffix(), KeyLock: 10 * time.Second, RelayLease: 30 * time.Second,
				RelayWorkers: 1, Workers: 2, MaxConns: 8,
			}
			ctx := context.Background()
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			a, err := openApp(ctx, cfg, log)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				closeApp(a)
				if in, err := shopkit.OpenInspector(context.Background(), pg, cfg.Namespace); err == nil {
					in.DropNamespace()
					in.Close()
				}
			})
			if err := a.start(ctx); err != nil {
				t.Fatal(err)
			}

			client := placeTraced(t, addr)
			var problem error
			deadline := time.Now().Add(60 * time.Second)
			for {
				got := inTrace(exporter.GetSpans(), client.TraceID())
				if problem = checkShopTrace(got, client, tr.system); problem == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after 60s: %v\nspans of the trace:\n%s", problem, describe(got))
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

// placeTraced places an order within a client span, its trace context in a
// traceparent header, and returns the span's context.
func placeTraced(t *testing.T, addr string) trace.SpanContext {
	t.Helper()
	ctx, span := otel.Tracer("shop-test").Start(context.Background(), "client places an order", trace.WithSpanKind(trace.SpanKindClient))
	defer span.End()
	body := `{"customer_id":"c-trace","lines":[{"product_id":"p-1","quantity":"1.000"}]}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/orders", bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	otel.GetTextMapPropagator().Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /orders: %d %s", resp.StatusCode, b)
	}
	return span.SpanContext()
}

func inTrace(all tracetest.SpanStubs, id trace.TraceID) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range all {
		if s.SpanContext.TraceID() == id {
			out = append(out, s)
		}
	}
	return out
}

// checkShopTrace returns the first link of the expected trace that spans
// lack, nil when every one is there.
func checkShopTrace(spans tracetest.SpanStubs, client trace.SpanContext, system string) error {
	server, err := find(spans, "the order API's server span", client.SpanID(), func(s tracetest.SpanStub) bool {
		return s.SpanKind == trace.SpanKindServer && s.Name == "POST /orders"
	})
	if err != nil {
		return err
	}
	// The order's event: sent by the relay and processed by its three
	// consumers, all children of the request's span, whose context the
	// outbox row carried.
	if _, err := sent(spans, shop.OrderPlaced, server.SpanContext.SpanID(), system); err != nil {
		return err
	}
	processed := map[string]tracetest.SpanStub{}
	for _, consumer := range []string{stock.ConsumerName, shipping.PreparationConsumer, billing.InvoiceConsumer} {
		p, err := process(spans, consumer, shop.OrderPlaced, server.SpanContext.SpanID(), system)
		if err != nil {
			return err
		}
		processed[consumer] = p
	}
	// What the consumers wrote in their handlers continues the trace.
	prep := processed[shipping.PreparationConsumer].SpanContext.SpanID()
	if _, err := sent(spans, shop.PreparationCreated, prep, system); err != nil {
		return err
	}
	for _, consumer := range []string{order.ConsumerName, shipping.CarrierConsumer} {
		if _, err := process(spans, consumer, shop.PreparationCreated, prep, system); err != nil {
			return err
		}
	}
	inv := processed[billing.InvoiceConsumer].SpanContext.SpanID()
	if _, err := process(spans, billing.MailerConsumer, shop.InvoiceCreated, inv, system); err != nil {
		return err
	}
	return nil
}

// sent finds the relay's span that sent event, child of parent.
func sent(spans tracetest.SpanStubs, event string, parent trace.SpanID, system string) (tracetest.SpanStub, error) {
	return find(spans, "the relay's send span of "+event, parent, func(s tracetest.SpanStub) bool {
		a := attrs(s)
		return s.SpanKind == trace.SpanKindProducer && a["idem.event.name"] == event &&
			a["messaging.system"] == system && a["messaging.operation.type"] == "send" &&
			a["messaging.destination.name"] != "" && a["messaging.message.id"] != "" && strings.HasPrefix(s.Name, "send ")
	})
}

// process finds consumer's span that applied event, child of parent.
func process(spans tracetest.SpanStubs, consumer, event string, parent trace.SpanID, system string) (tracetest.SpanStub, error) {
	return find(spans, consumer+"'s process span of "+event, parent, func(s tracetest.SpanStub) bool {
		a := attrs(s)
		return s.SpanKind == trace.SpanKindConsumer && a["messaging.consumer.group.name"] == consumer &&
			a["idem.event.name"] == event && a["idem.outcome"] == "applied" && a["messaging.system"] == system &&
			a["messaging.operation.type"] == "process" && a["messaging.destination.name"] != "" && a["messaging.message.id"] != ""
	})
}

// find returns the span that matches, child of parent.
func find(spans tracetest.SpanStubs, what string, parent trace.SpanID, match func(tracetest.SpanStub) bool) (tracetest.SpanStub, error) {
	var others []string
	for _, s := range spans {
		if !match(s) {
			continue
		}
		if s.Parent.SpanID() == parent {
			return s, nil
		}
		others = append(others, s.Parent.SpanID().String())
	}
	if len(others) > 0 {
		return tracetest.SpanStub{}, fmt.Errorf("%s has parent %s, want %s", what, strings.Join(others, ", "), parent)
	}
	return tracetest.SpanStub{}, fmt.Errorf("no %s", what)
}

func attrs(s tracetest.SpanStub) map[string]string {
	m := make(map[string]string, len(s.Attributes))
	for _, kv := range s.Attributes {
		m[string(kv.Key)] = kv.Value.String()
	}
	return m
}

func describe(spans tracetest.SpanStubs) string {
	var b strings.Builder
	for _, s := range spans {
		a := attrs(s)
		keep := []attribute.KeyValue{}
		for _, k := range []string{"messaging.consumer.group.name", "idem.event.name", "idem.outcome", "messaging.system", "messaging.destination.name"} {
			if v, ok := a[k]; ok {
				keep = append(keep, attribute.String(k, v))
			}
		}
		raw, _ := json.Marshal(keep)
		fmt.Fprintf(&b, "  %s %s parent=%s kind=%s %q %s\n", s.SpanContext.SpanID(), s.Name, s.Parent.SpanID(), s.SpanKind, s.Status.Description, raw)
	}
	return b.String()
}
