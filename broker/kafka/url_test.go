package kafka_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"log"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/broker/kafka"
)

// certFiles writes a self-signed certificate and its key to dir and
// returns their files.
func certFiles(t *testing.T, dir string) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "idem"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	for file, block := range map[string]*pem.Block{cert: {Type: "CERTIFICATE", Bytes: der}, key: {Type: "EC PRIVATE KEY", Bytes: kder}} {
		if err := os.WriteFile(file, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return cert, key
}

func TestParseURL(t *testing.T) {
	cert, key := certFiles(t, t.TempDir())
	for _, c := range []struct {
		name, url   string
		brokers     []string
		clientID    string
		topicPrefix string
		tls         bool
		opts        int // franz-go options: session timeout, SASL
	}{
		{"one broker", "kafka://a:9092", []string{"a:9092"}, "", "", false, 0},
		{"several, a trailing slash", "kafka://a:9092, b:9093,/", []string{"a:9092", "b:9093"}, "", "", false, 0},
		{"topic prefix and client id", "kafka://a:9092?topic_prefix=shop.events.&client_id=relay", []string{"a:9092"}, "relay", "shop.events.", false, 0},
		{"session timeout", "kafka://a:9092?session_timeout=6s", []string{"a:9092"}, "", "", false, 1},
		{"tls=true", "kafka://a:9092?tls=true", []string{"a:9092"}, "", "", true, 0},
		{"tls=false", "kafka://a:9092?tls=false", []string{"a:9092"}, "", "", false, 0},
		{"a CA implies TLS", "kafka://a:9092?tls_ca=" + cert, []string{"a:9092"}, "", "", true, 0},
		{"a client certificate", "kafka://a:9092?tls_cert=" + cert + "&tls_key=" + key, []string{"a:9092"}, "", "", true, 0},
		{"SASL without TLS", "kafka://a:9092?sasl=scram-sha-512&sasl_user=u&sasl_password=p", []string{"a:9092"}, "", "", false, 1},
		{"SASL PLAIN and a session timeout", "kafka://a:9092?sasl=PLAIN&sasl_user=u&session_timeout=10s", []string{"a:9092"}, "", "", false, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			u, err := kafka.ParseURL(c.url)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(u.Brokers, c.brokers) || u.ClientID != c.clientID || u.TopicPrefix != c.topicPrefix ||
				(u.TLS != nil) != c.tls || len(u.Opts) != c.opts {
				t.Errorf("ParseURL(%q) = brokers %q, client id %q, topic prefix %q, TLS %v, %d options; want %q, %q, %q, TLS %v, %d options",
					c.url, u.Brokers, u.ClientID, u.TopicPrefix, u.TLS != nil, len(u.Opts), c.brokers, c.clientID, c.topicPrefix, c.tls, c.opts)
			}
		})
	}
}

func TestParseURLErrors(t *testing.T) {
	cert, _ := certFiles(t, t.TempDir())
	for _, c := range []struct {
		url, want string // want: in the error
	}{
		{"a:9092", "want kafka://"},
		{"amqp://a:9092", "want kafka://"},
		{"kafka://", "no broker address"},
		{"kafka://,?tls=true", "no broker address"},
		{"kafka://a:1?nope=1", `unknown parameter "nope"`},
		{"kafka://a:1?session_timeout=soon", `session_timeout "soon": want a positive duration`},
		{"kafka://a:1?session_timeout=-1s", `session_timeout "-1s"`},
		{"kafka://a:1?tls=maybe", `tls="maybe": want true or false`},
		{"kafka://a:1?tls_cert=c.pem", "tls_cert and tls_key go together"},
		{"kafka://a:1?tls_ca=/nonexistent/ca.pem", "tls_ca: "},
		{"kafka://a:1?tls_ca=" + os.DevNull, "no PEM certificate"},
		{"kafka://a:1?tls_cert=" + cert + "&tls_key=" + os.DevNull, "tls_cert/tls_key: "},
		{"kafka://a:1?sasl=plain&sasl_password=s3cret", "sasl=plain needs sasl_user"},
		{"kafka://a:1?sasl=gssapi&sasl_user=u&sasl_password=s3cret", `sasl="gssapi": want plain, scram-sha-256 or scram-sha-512`},
		{"kafka://a:1?sasl_user=u", "sasl_user and sasl_password need sasl="},
		{"kafka://u:s3cret@a:1?sasl_password=s3cret", "sasl_user and sasl_password need sasl="},
		{"kafka://a:1?%zz", "invalid URL escape"},
	} {
		_, err := kafka.ParseURL(c.url)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "idem: kafka: ") {
			t.Errorf("ParseURL(%q): %v; want an error with %q", c.url, err, c.want)
		} else if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("ParseURL(%q): %v shows the password", c.url, err)
		}
	}
}

// $IDEM_KAFKA_SASL_PASSWORD stands for sasl_password.
func TestParseURLSASLPasswordFromEnvironment(t *testing.T) {
	t.Setenv("IDEM_KAFKA_SASL_PASSWORD", "s3cret")
	u, err := kafka.ParseURL("kafka://a:9092?sasl=scram-sha-256&sasl_user=idem")
	if err != nil || len(u.Opts) != 1 {
		t.Fatalf("ParseURL: %d options, %v; want the SASL option", len(u.Opts), err)
	}
}

// The URL the idem command takes gives the configuration of a publisher
// and of a subscriber, which sets its group and topics.
func ExampleParseURL() {
	u, err := kafka.ParseURL("kafka://k1:9092,k2:9092?topic_prefix=shop.&tls=true&sasl=scram-sha-512&sasl_user=relay&sasl_password=secret")
	if err != nil {
		log.Fatal(err)
	}
	pc := u.PublisherConfig()
	fmt.Println(pc.Brokers, pc.TLS != nil, pc.TopicReplacement)

	sc := u.SubscriberConfig()
	sc.Group, sc.Topics = "stock", []string{sc.TopicPrefix + "order"}
	fmt.Println(sc.Topics)
	// Output:
	// [k1:9092 k2:9092] true shop.${routedByValue}
	// [shop.order]
}
