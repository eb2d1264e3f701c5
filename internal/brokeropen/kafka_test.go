package brokeropen

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/kafka"
	"github.com/idem-go/idem/inbox"
)

func TestKafkaConfig(t *testing.T) {
	cfg, err := kafkaConfig("kafka://a:9092,b:9093?topic_prefix=shop.events.")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.Brokers, []string{"a:9092", "b:9093"}) || cfg.TopicReplacement != "shop.events."+kafka.RoutedByValue {
		t.Errorf("config = %+v", cfg)
	}
	if cfg, err := kafkaConfig("kafka://a:9092?session_timeout=6s"); err != nil || len(cfg.Opts) != 1 {
		t.Errorf("session_timeout: %d options, %v; want one option", len(cfg.Opts), err)
	}
	for _, bad := range []string{"kafka://", "kafka://a:1?nope=1", "kafka://a:1?session_timeout=soon", "kafka://a:1?session_timeout=-1s"} {
		if _, err := kafkaConfig(bad); err == nil {
			t.Errorf("kafkaConfig(%q) accepted", bad)
		}
	}
}

func TestOpenKafka(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "p.order"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pub, err := Open(ctx, "kafka://"+c.ListenAddrs()[0]+"?topic_prefix=p.")
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ev, _ := idem.NewEvent("order.order.placed.v1", "order", "1", map[string]int{})
	m, _ := idem.NewMessage(ev)
	if err := pub.Publish(ctx, []idem.Message{m}); err != nil {
		t.Fatal(err)
	}
}

// TestSubscribeKafka publishes with OpenPrefixed and receives with
// Subscribe, both with a prefix, on topics the subscriber creates.
func TestSubscribeKafka(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := "kafka://" + c.ListenAddrs()[0]
	got := make(chan inbox.Delivery, 10)
	deliver := func(_ context.Context, ds []inbox.Delivery) ([]inbox.Disposition, []error) {
		out := make([]inbox.Disposition, len(ds))
		for i, d := range ds {
			got <- d
			out[i] = inbox.Disposition{Action: inbox.Ack, Outcome: inbox.Applied}
		}
		return out, make([]error, len(ds))
	}
	sub, err := Subscribe(url, SubscribeConfig{Consumer: "stock", EventNames: []string{"order.order.placed.v1"}, Prefix: "p"}, deliver)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := sub.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	pub, err := OpenPrefixed(ctx, url, "p")
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ev, _ := idem.NewEvent("order.order.placed.v1", "order", "42", map[string]int{})
	m, _ := idem.NewMessage(ev)
	if err := pub.Publish(ctx, []idem.Message{m}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.Message.EventID != m.EventID || !strings.Contains(r.Source, "p.outbox.event.order") {
			t.Errorf("received %s from %q", r.Message.EventID, r.Source)
		}
	case <-ctx.Done():
		t.Fatal("message not received")
	}
}
