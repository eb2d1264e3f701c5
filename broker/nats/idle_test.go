package nats_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/brokertest"
)

// TestIdleSubscriberLongPolls: an idle subscriber keeps one long pull
// request open at the server instead of fetching in a loop, and a message
// published meanwhile is delivered at once, through the request that waits.
//
// No clock of the test's decides: a connection watches the subscriber's
// pull requests and the server's answers to them, in the order the server
// sends them. While the server holds the first request it sends a heartbeat
// every idle_heartbeat; once it has sent three seconds of them, a subscriber
// that fetched in a loop would have sent more requests before the last one.
// The published message is seen by the watcher before the server delivers
// it: a delivery with no pull request in between came through a request
// that was already waiting.
func TestIdleSubscriberLongPolls(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	n := newNames()
	pub := newPublisher(t, srv.url(), n.stream)

	watch, err := natsgo.Connect(srv.url())
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	// One channel for every subscription of watch: the messages come in the
	// order of the connection.
	seen := make(chan *natsgo.Msg, 4096)
	chanSubscribe := func(subject string) {
		t.Helper()
		if _, err := watch.ChanSubscribe(subject, seen); err != nil {
			t.Fatal(err)
		}
		if err := watch.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	// next returns the next message seen, or fails the test once deadline
	// has passed.
	var deadline time.Time
	next := func(what string) *natsgo.Msg {
		t.Helper()
		select {
		case m := <-seen:
			return m
		case <-time.After(time.Until(deadline)):
			t.Fatalf("still waiting for %s after 30s", what)
			return nil
		}
	}
	pullSubject := "$JS.API.CONSUMER.MSG.NEXT." + n.stream.Name + ".idle"
	chanSubscribe(pullSubject)
	chanSubscribe(n.stream.SubjectPrefix + ".>") // the publish, as the stream receives it

	got := make(chan struct{}, 10)
	subscribe(t, srv.url(), n.stream, "idle", func(_ context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
		disps := make([]broker.Disposition, len(ds))
		for i := range ds {
			got <- struct{}{}
			disps[i].Action = broker.Ack
		}
		return disps, make([]error, len(ds))
	})

	deadline = time.Now().Add(30 * time.Second)
	first := next("the subscriber's first pull request")
	if first.Subject != pullSubject {
		t.Fatalf("first seen %q, want a pull request on %s", first.Subject, pullSubject)
	}
	var req struct {
		Expires   time.Duration `json:"expires"`
		Heartbeat time.Duration `json:"idle_heartbeat"`
	}
	if err := json.Unmarshal(first.Data, &req); err != nil {
		t.Fatalf("pull request %q: %v", first.Data, err)
	}
	if req.Expires < 3*time.Second || req.Heartbeat <= 0 {
		t.Fatalf("pull request %s: want a long poll (expires of 3s or more) with idle heartbeats", first.Data)
	}
	chanSubscribe(first.Reply) // the server's answers: heartbeats, messages

	// Three seconds of heartbeats, counted from the request's own.
	deadline = time.Now().Add(30 * time.Second)
	pulls, beats := 1, 0
	for want := int((3*time.Second + req.Heartbeat - 1) / req.Heartbeat); beats < want; {
		switch m := next("the server's heartbeats on the pull request"); {
		case m.Subject == pullSubject:
			pulls++
		case m.Subject == first.Reply && m.Header.Get("Status") == "100":
			beats++
		}
	}
	if pulls != 1 {
		t.Errorf("an idle subscriber sent %d pull requests while the server sent %d heartbeats (%v); want one long poll",
			pulls, beats, time.Duration(beats)*req.Heartbeat)
	}

	brokertest.Publish(t, pub, brokertest.NewMessage(t, "order.order.placed.v1", "1", 0))
	deadline = time.Now().Add(30 * time.Second)
	published, pullsSince := false, 0
	for delivered := false; !delivered; {
		// A delivery keeps the message's subject; its reply is the
		// acknowledgement's subject.
		switch m := next("the message, published then delivered"); {
		case m.Subject == pullSubject:
			if published {
				pullsSince++
			}
		case strings.HasPrefix(m.Reply, "$JS.ACK."):
			// The observer may see the delivery before its copy of the
			// publish: the server routes the two from different
			// clients (the publisher, the stream's consumer), in no
			// order between them. A delivery means the stream has the
			// message; the pulls counted are those seen between the two.
			delivered = true
		case strings.HasPrefix(m.Subject, n.stream.SubjectPrefix+"."):
			published = true
		}
	}
	if pullsSince != 0 {
		t.Errorf("the subscriber sent %d pull requests between the publish and the delivery; want it delivered through the request that waits", pullsSince)
	}
	select {
	case <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("the message was not handed to the consumer")
	}
}
