// Package testtls makes the certificates of the TLS tests: a private
// certificate authority of the test's own, a server certificate for
// 127.0.0.1, ::1 and localhost, and a client certificate, written as PEM
// files. Each TLS test runs a real server (RabbitMQ, PostgreSQL, MariaDB,
// kfake, nats-server) with certificates no one else trusts; a second PKI
// (New again) is the wrong authority a client must refuse.
package testtls

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// ClientName is the common name of the client certificate.
const ClientName = "idem-client"

// PKI is a private certificate authority and the certificates it signed,
// as files in Dir: ca.pem, server.pem and server-key.pem, client.pem and
// client-key.pem (keys in PKCS #8, ECDSA P-256). The certificates are valid
// from an hour ago for a day.
type PKI struct {
	// Dir is the directory of the files.
	Dir string
	// CA is the authority's certificate: what a client or a server trusts.
	CA string
	// ServerCert and ServerKey are the server's certificate, for
	// 127.0.0.1, ::1 and localhost, and its key.
	ServerCert, ServerKey string
	// ClientCert and ClientKey are the client's certificate (common name
	// ClientName) and its key.
	ClientCert, ClientKey string
}

// New writes a new PKI in a directory of t.TempDir(), removed when the test
// ends.
func New(t testing.TB) *PKI {
	t.Helper()
	p, err := Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Write writes a new PKI in dir, which must exist: for a TestMain, which
// has no test to tie it to.
func Write(dir string) (*PKI, error) {
	p := &PKI{Dir: dir}
	caCert, caKey, err := p.issue("ca", &x509.Certificate{
		Subject:               pkix.Name{CommonName: "idem test CA"},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}, nil, nil)
	if err != nil {
		return nil, err
	}
	if _, _, err := p.issue("server", &x509.Certificate{
		Subject:     pkix.Name{CommonName: "localhost"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, caCert, caKey); err != nil {
		return nil, err
	}
	if _, _, err := p.issue("client", &x509.Certificate{
		Subject:     pkix.Name{CommonName: ClientName},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, caCert, caKey); err != nil {
		return nil, err
	}
	p.CA = filepath.Join(dir, "ca.pem")
	p.ServerCert, p.ServerKey = filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	p.ClientCert, p.ClientKey = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	return p, nil
}

// issue writes name.pem and name-key.pem: tmpl signed by parent, or
// self-signed when parent is nil.
func (p *PKI) issue(name string, tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return nil, nil, fmt.Errorf("testtls: certificate %s: %w", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	for file, block := range map[string]*pem.Block{
		name + ".pem":     {Type: "CERTIFICATE", Bytes: der},
		name + "-key.pem": {Type: "PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(filepath.Join(p.Dir, file), pem.EncodeToMemory(block), 0o600); err != nil {
			return nil, nil, err
		}
	}
	return cert, key, nil
}

// ServerConfig returns the configuration of a server in the test's process
// (kfake, nats-server): the server certificate and, when requireClient is
// set, a client certificate signed by the CA required.
func (p *PKI) ServerConfig(t testing.TB, requireClient bool) *tls.Config {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(p.ServerCert, p.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if requireClient {
		cfg.ClientCAs = p.pool(t)
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg
}

// ClientConfig returns a client configuration that trusts the CA only
// and, when withCert is set, presents the client certificate.
func (p *PKI) ClientConfig(t testing.TB, withCert bool) *tls.Config {
	t.Helper()
	cfg := &tls.Config{RootCAs: p.pool(t), MinVersion: tls.VersionTLS12}
	if withCert {
		pair, err := tls.LoadX509KeyPair(p.ClientCert, p.ClientKey)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg
}

func (p *PKI) pool(t testing.TB) *x509.CertPool {
	t.Helper()
	b, err := os.ReadFile(p.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		t.Fatalf("testtls: no certificate in %s", p.CA)
	}
	return pool
}

// CopyTo copies the server's files (CA, certificate, key) into dir, owned
// by uid and gid (-1 keeps the owner) with mode 0600, for a server that
// runs as another user and insists that only it reads its key
// (PostgreSQL, MariaDB run by root as postgres or mysql). It returns the
// paths of the copies: CA, certificate, key.
func (p *PKI) CopyTo(dir string, uid, gid int) (ca, cert, key string, err error) {
	out := make([]string, 3)
	for i, src := range []string{p.CA, p.ServerCert, p.ServerKey} {
		b, err := os.ReadFile(src)
		if err != nil {
			return "", "", "", err
		}
		dst := filepath.Join(dir, "tls-"+filepath.Base(src))
		if err := os.WriteFile(dst, b, 0o600); err != nil {
			return "", "", "", err
		}
		if err := os.Chown(dst, uid, gid); err != nil {
			return "", "", "", err
		}
		out[i] = dst
	}
	return out[0], out[1], out[2], nil
}

// SetQuery returns rawURL with its query parameters set to the pairs of
// kv (name, value, name, value...); an empty value removes the parameter.
// TLS tests make the variants of a server's URL with it: another CA, no
// client certificate.
func SetQuery(t testing.TB, rawURL string, kv ...string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "" {
			q.Del(kv[i])
		} else {
			q.Set(kv[i], kv[i+1])
		}
	}
	u.RawQuery = q.Encode()
	return u.String()
}
