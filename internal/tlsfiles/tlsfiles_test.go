package tlsfiles_test

import (
	"crypto/tls"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/idem-go/idem/internal/testtls"
	"github.com/idem-go/idem/internal/tlsfiles"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func files(ca, cert, key string) tlsfiles.Files {
	return tlsfiles.Files{CA: ca, Cert: cert, Key: key, CAParam: "ca", CertParam: "cert", KeyParam: "key"}
}

func TestConfig(t *testing.T) {
	pki := testtls.New(t)
	cfg, err := files(pki.CA, pki.ClientCert, pki.ClientKey).Config()
	if err != nil || cfg.RootCAs == nil || len(cfg.Certificates) != 1 || cfg.MinVersion != tls.VersionTLS12 {
		t.Fatalf("Config: %+v, %v", cfg, err)
	}
	if cfg, err := files("", "", "").Config(); err != nil || cfg.RootCAs != nil || len(cfg.Certificates) != 0 {
		t.Errorf("no files: %+v, %v; want the system's roots and no certificate", cfg, err)
	}
	for _, c := range []struct {
		f    tlsfiles.Files
		want string
	}{
		{files("/nonexistent/ca.pem", "", ""), "ca: open /nonexistent/ca.pem"},
		{files(os.DevNull, "", ""), "ca " + os.DevNull + ": no PEM certificate in it"},
		{files(pki.CA, pki.ClientCert, ""), "cert and key go together"},
		{files(pki.CA, "", pki.ClientKey), "cert and key go together"},
		{files(pki.CA, pki.ClientCert, pki.ServerKey), "cert/key: tls: private key does not match public key"},
	} {
		if _, err := c.f.Config(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error with %q", c.f, err, c.want)
		}
	}
}

// TestVerifyChainOnly handshakes with a real TLS server whose certificate
// names 127.0.0.1 and localhost, reached as db.example: full verification
// refuses the name, chain verification accepts it but refuses a
// certificate another CA signed.
func TestVerifyChainOnly(t *testing.T) {
	pki := testtls.New(t)
	l, err := tls.Listen("tcp", "127.0.0.1:0", pki.ServerConfig(t, false))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			_ = c.Close()
		}
	}()
	defer func() { _ = l.Close(); <-done }()
	dial := func(ca string, chainOnly bool) error {
		cfg, err := files(ca, "", "").Config()
		if err != nil {
			t.Fatal(err)
		}
		cfg.ServerName = "db.example"
		if chainOnly {
			tlsfiles.VerifyChainOnly(cfg)
		}
		c, err := tls.Dial("tcp", l.Addr().String(), cfg)
		if err == nil {
			_ = c.Close()
		}
		return err
	}
	if err := dial(pki.CA, false); err == nil || !strings.Contains(err.Error(), "not db.example") {
		t.Errorf("full verification of another name: %v, want a refusal", err)
	}
	if err := dial(pki.CA, true); err != nil {
		t.Errorf("chain verification of another name: %v", err)
	}
	if err := dial(testtls.New(t).CA, true); err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("chain verification against another CA: %v, want a refusal", err)
	}
}
