package registry

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestEmbeddedNATSSharedInProcess opens a publisher and a subscriber on one
// embedded directory: they share one server, which stops with its last user
// and keeps the data for the next.
func TestEmbeddedNATSSharedInProcess(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := "embedded?dir=" + t.TempDir()
	got := make(chan idem.Message, 10)
	deliver := func(_ context.Context, ds []inbox.Delivery) ([]inbox.Disposition, []error) {
		out := make([]inbox.Disposition, len(ds))
		for i, d := range ds {
			got <- d.Message
			out[i] = inbox.Disposition{Action: inbox.Ack, Outcome: inbox.Applied}
		}
		return out, make([]error, len(ds))
	}
	ev, err := idem.NewEvent("order.order.placed.v1", "order", "42", map[string]int{"n": 1})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := idem.NewMessage(ev)
	if err != nil {
		t.Fatal(err)
	}

	pub, err := Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx, []idem.Message{msg}); err != nil {
		t.Fatal(err)
	}
	if err := pub.Close(); err != nil {
		t.Fatal(err)
	}
	if n := len(embeddedServers); n != 0 {
		t.Fatalf("%d embedded server(s) still running after the last Close", n)
	}

	// A new server on the same directory delivers the message.
	pub, err = Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	sub, err := Subscribe(url, SubscribeConfig{Consumer: "stock", EventNames: []string{"order.order.placed.v1"}}, deliver)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := sub.Stop(ctx); err != nil {
			t.Error(err)
		}
	}()
	if n := len(embeddedServers); n != 1 {
		t.Fatalf("%d embedded servers, want one shared by the publisher and the subscriber", n)
	}
	select {
	case m := <-got:
		if m.EventID != msg.EventID || string(m.Key) != "42" {
			t.Errorf("received %s key %q", m.EventID, m.Key)
		}
	case <-ctx.Done():
		t.Fatal("message published before the restart not received")
	}
}
