package registry

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
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

// selfSigned writes a CA-less self-signed certificate for 127.0.0.1 to dir
// and returns the server's TLS configuration and the certificate's file.
func selfSigned(t *testing.T, dir string) (*tls.Config, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kfake"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}, file
}

// A broker URL's TLS and SASL parameters reach the cluster: with the right
// CA and credentials the publisher works, with a wrong password it is
// refused.
func TestKafkaTLSAndSASL(t *testing.T) {
	serverTLS, ca := selfSigned(t, t.TempDir())
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "outbox.event.order"),
		kfake.TLS(serverTLS), kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "idem", "s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	base := "kafka://" + c.ListenAddrs()[0] + "?tls_ca=" + url.QueryEscape(ca) + "&sasl=scram-sha-256&sasl_user=idem"
	pub, err := Open(ctx, base+"&sasl_password=s3cret")
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ev, _ := idem.NewEvent("order.order.placed.v1", "order", "1", map[string]int{})
	m, _ := idem.NewMessage(ev)
	if err := pub.Publish(ctx, []idem.Message{m}); err != nil {
		t.Fatalf("publish over TLS with SCRAM: %v", err)
	}
	wrong, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if p, err := Open(wrong, base+"&sasl_password=nope"); err == nil {
		_ = p.Close()
		t.Fatal("a wrong SASL password was accepted")
	}
}
