package amqp_test

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/internal/testtls"
)

// TestTLS runs a publisher and a subscriber made from an amqps:// URL
// (ParseURL: cacertfile, certfile, keyfile) against a RabbitMQ node of the
// test's own whose TLS listener verifies clients against a private CA and
// refuses a client without a certificate (ssl_options.verify =
// verify_peer, fail_if_no_peer_cert = true): an event published is
// consumed once. The client refuses the node when the URL trusts another
// CA; the node refuses a client without a certificate.
func TestTLS(t *testing.T) {
	t.Parallel()
	pki := testtls.New(t)
	node := testamqp.StartClusterWith(t, 1, testamqp.ClusterOptions{TLS: pki})
	url := node.TLSURL(0)
	uc, err := amqp.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	exchange := testamqp.Name("idem_t_")
	pcfg := uc.PublisherConfig()
	pcfg.Exchange = exchange
	pub, err := amqp.NewPublisher(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	c := brokertest.EffectConsumer(t, testdb.NewPostgres(t).Driver, inbox.Config{Name: "stock", Retry: fastRetry}, nil)
	scfg := uc.SubscriberConfig()
	scfg.Exchange, scfg.Queue, scfg.Bindings = exchange, exchange+".events", []string{"#"}
	testsvc.Start(t, newSubscriber(t, scfg, c.DeliverBatch))
	brokertest.Publish(t, pub, brokertest.NewMessage(t, "order.order.placed.v1", "1", 0))
	testsvc.WaitFor(t, 30*time.Second, "the event consumed over TLS", func() bool { return c.Stats().Applied == 1 })

	connect := func(url string, tlsCfg *tls.Config) error {
		uc, err := amqp.ParseURL(url)
		if err != nil {
			t.Fatal(err)
		}
		uc.TLS = tlsCfg
		p, err := amqp.NewPublisher(uc.PublisherConfig())
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return p.Connect(ctx)
	}
	if err := connect(testtls.SetQuery(t, url, "cacertfile", testtls.New(t).CA), nil); err == nil ||
		!strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("another CA: %v, want the client's refusal of the node's certificate", err)
	}
	// Without a client certificate the node refuses the connection. Under
	// TLS 1.3 the client's handshake ends before the node checks for one:
	// its alert (certificate required) reaches the client, or the client's
	// first write or read meets the closed connection (measured: a reset,
	// amqp091-go's "channel/connection is not open"), whichever comes
	// first. Under TLS 1.2 the node checks it during the handshake, whose
	// end is the node's alert.
	noCert := testtls.SetQuery(t, url, "certfile", "", "keyfile", "")
	if err := connect(noCert, nil); err == nil {
		t.Error("no client certificate: connected")
	}
	tls12 := pki.ClientConfig(t, false)
	tls12.MaxVersion = tls.VersionTLS12
	if err := connect(noCert, tls12); err == nil || !strings.Contains(err.Error(), "remote error: tls: handshake failure") {
		t.Errorf("no client certificate, TLS 1.2: %v, want the node's alert", err)
	}
	// The URL's files are checked when a publisher is made from a URL
	// that did not go through ParseURL, too.
	if _, err := amqp.NewPublisher(amqp.PublisherConfig{ConnConfig: amqp.ConnConfig{URL: testtls.SetQuery(t, url, "keyfile", "")}}); err == nil ||
		!strings.Contains(err.Error(), "certfile and keyfile go together") {
		t.Errorf("a certificate without its key: %v", err)
	}
}
