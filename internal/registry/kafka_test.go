package registry

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testtls"
)

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

// A broker URL's TLS and SASL parameters reach the cluster: with the
// private CA, the client certificate and the right credentials the
// publisher works; another CA, no client certificate or a wrong password
// are refused.
func TestKafkaTLSAndSASL(t *testing.T) {
	pki := testtls.New(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "outbox.event.order"),
		kfake.TLS(pki.ServerConfig(t, true)), kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "idem", "s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	base := "kafka://" + c.ListenAddrs()[0] + "?" + url.Values{"tls_ca": {pki.CA}, "tls_cert": {pki.ClientCert}, "tls_key": {pki.ClientKey},
		"sasl": {"scram-sha-256"}, "sasl_user": {"idem"}, "sasl_password": {"s3cret"}}.Encode()
	pub, err := Open(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ev, _ := idem.NewEvent("order.order.placed.v1", "order", "1", map[string]int{})
	m, _ := idem.NewMessage(ev)
	if err := pub.Publish(ctx, []idem.Message{m}); err != nil {
		t.Fatalf("publish over TLS with SCRAM: %v", err)
	}
	for _, r := range []struct {
		what, url, want string
	}{
		{"a wrong SASL password", testtls.SetQuery(t, base, "sasl_password", "nope"), ""},
		{"another CA", testtls.SetQuery(t, base, "tls_ca", testtls.New(t).CA), "certificate signed by unknown authority"},
		{"no client certificate", testtls.SetQuery(t, base, "tls_cert", "", "tls_key", ""), "tls: certificate required"},
	} {
		wrong, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		p, err := Open(wrong, r.url)
		cancel()
		if err == nil {
			_ = p.Close()
		}
		if err == nil || !strings.Contains(err.Error(), r.want) {
			t.Errorf("%s: %v, want an error saying %q", r.what, err, r.want)
		} else if strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "nope") {
			t.Errorf("%s: %v shows the SASL password", r.what, err)
		}
	}
}
