package registry

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
)

// A broker URL with cloudevents publishes CloudEvents, which a subscriber
// of the same URL receives and the decoder reads as the event sent.
func TestCloudEventsFromBrokerURL(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "outbox.event.order"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tc := range []struct{ url, header string }{
		{"kafka://" + c.ListenAddrs()[0] + "?cloudevents=binary&cloudevents_source=%2Fshop%2Forder", "ce_source"},
		{"embedded?dir=" + t.TempDir() + "&cloudevents=binary&cloudevents_source=%2Fshop%2Forder", "ce-source"},
		{"kafka://" + c.ListenAddrs()[0] + "?cloudevents=structured&cloudevents_source=%2Fshop%2Forder", "content-type"},
	} {
		func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			got := make(chan idem.Message, 10)
			deliver := func(_ context.Context, ds []inbox.Delivery) ([]inbox.Disposition, []error) {
				out := make([]inbox.Disposition, len(ds))
				for i, d := range ds {
					got <- d.Message
					out[i] = inbox.Disposition{Action: inbox.Ack, Outcome: inbox.Applied}
				}
				return out, make([]error, len(ds))
			}
			pub, err := Open(ctx, tc.url)
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			sub, err := Subscribe(tc.url, SubscribeConfig{Consumer: "stock", EventNames: []string{"order.order.placed.v1"}}, deliver)
			if err != nil {
				t.Fatal(err)
			}
			if err := sub.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = sub.Stop(context.Background()) }()
			ev, _ := idem.NewEvent("order.order.placed.v1", "order", "42", map[string]int{"n": 1})
			msg, _ := idem.NewMessage(ev)
			if err := pub.Publish(ctx, []idem.Message{msg}); err != nil {
				t.Fatal(err)
			}
			select {
			case m := <-got:
				dec, err := idem.Decode(m)
				if err != nil || dec.ID != ev.ID || dec.Name != ev.Name || dec.AggregateID != "42" || dec.Headers["ce_source"] != "/shop/order" || m.Headers[tc.header] == "" {
					t.Errorf("%s: received %+v, decoded %+v, %v", tc.url, m, dec, err)
				}
			case <-ctx.Done():
				t.Fatalf("%s: message not received", tc.url)
			}
		}()
	}
}
