// Package tlsfiles builds the TLS configuration of a client from the PEM
// files a URL names: the certificate authority to trust and the client
// certificate to present. The MariaDB URLs of driver/mysql and the Kafka
// URLs of broker/kafka build theirs with it, and the RabbitMQ URLs are
// checked with it, so that each says the same about a missing file, a file
// without a certificate or a certificate without its key.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// Files are the PEM files of a TLS client, and the names of the URL
// parameters that gave them, which errors use.
type Files struct {
	// CA holds the certificates of the authorities that sign the server's
	// certificate; empty: the system's roots.
	CA string
	// Cert and Key are the client certificate and its private key; both or
	// neither.
	Cert, Key string
	// CAParam, CertParam and KeyParam are the names of the parameters of
	// CA, Cert and Key in the URL (tls_ca, sslrootcert, cacertfile...).
	CAParam, CertParam, KeyParam string
}

// Empty reports whether no file is named.
func (f Files) Empty() bool { return f.CA == "" && f.Cert == "" && f.Key == "" }

// Config reads the files and returns a client configuration, TLS 1.2 or
// later, that trusts the certificates of CA (the system's roots when CA is
// empty) and presents the Cert and Key pair (none when both are empty).
// Errors name the parameter: a file that cannot be read, a CA file without
// a PEM certificate, a certificate without its key or a key that does not
// match it.
func (f Files) Config() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.CA != "" {
		b, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.CAParam, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("%s %s: no PEM certificate in it", f.CAParam, f.CA)
		}
		cfg.RootCAs = pool
	}
	if (f.Cert == "") != (f.Key == "") {
		return nil, fmt.Errorf("%s and %s go together", f.CertParam, f.KeyParam)
	}
	if f.Cert != "" {
		pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("%s/%s: %w", f.CertParam, f.KeyParam, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// VerifyChainOnly makes cfg check that the server's certificate chains to
// one of cfg.RootCAs (the system's roots when nil) without checking the
// name it was issued for: libpq's sslmode=verify-ca, for servers reached
// under a name their certificate does not carry. crypto/tls verifies both
// or neither, so the chain is checked in VerifyConnection.
func VerifyChainOnly(cfg *tls.Config) {
	cfg.InsecureSkipVerify = true // the chain is verified below
	roots := cfg.RootCAs
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("tls: the server sent no certificate")
		}
		opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool()}
		for _, c := range cs.PeerCertificates[1:] {
			opts.Intermediates.AddCert(c)
		}
		if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
			return fmt.Errorf("tls: failed to verify certificate: %w", err)
		}
		return nil
	}
}
