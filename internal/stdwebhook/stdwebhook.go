// Package stdwebhook is the symmetric signature scheme of Standard Webhooks
// (https://www.standardwebhooks.com/, spec/standard-webhooks.md of
// github.com/standard-webhooks/standard-webhooks), for broker/webhook, which
// signs what it sends, and inbox/webhookin, which verifies what it receives:
// one implementation of the scheme for both ends.
//
// A request carries three headers: webhook-id (the message id, the same
// for every attempt), webhook-timestamp (the attempt's time, in unix
// seconds) and webhook-signature, a space-separated list of "v1,<base64 of
// HMAC-SHA256(key, "<id>.<timestamp>.<body>")>", one per signing key, so
// that a key can be rotated without downtime. A key is given as
// "whsec_<base64>" (the secret's serialization of the spec), the key being
// the decoded bytes.
package stdwebhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The headers of the scheme.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// SecretPrefix starts a serialized symmetric secret.
const SecretPrefix = "whsec_"

// MinKeyBytes and MaxKeyBytes bound the keys a sender signs with: the spec
// asks for 24 to 64 random bytes.
const (
	MinKeyBytes = 24
	MaxKeyBytes = 64
)

// Errors of Verify; each says why a request is not authentic.
var (
	// ErrMissing: a header of the scheme is absent or empty.
	ErrMissing = errors.New("missing Standard Webhooks header")
	// ErrTimestamp: the timestamp is not a number, or is outside the
	// tolerance around now (a replayed or delayed request).
	ErrTimestamp = errors.New("webhook-timestamp outside the tolerance")
	// ErrMismatch: no signature of the header matches any key.
	ErrMismatch = errors.New("no webhook-signature matches")
)

// ParseSecret returns the key of a secret "whsec_<base64>" (the prefix is
// optional, as the spec's reference libraries accept). Its errors never
// quote the secret.
func ParseSecret(secret string) ([]byte, error) {
	s := strings.TrimSpace(secret)
	s = strings.TrimPrefix(s, SecretPrefix)
	if s == "" {
		return nil, errors.New("the secret is empty: want whsec_ followed by the key in base64")
	}
	key, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		// The error quotes a position only, never the secret.
		return nil, fmt.Errorf("the secret is not whsec_ followed by base64 (%v)", err)
	}
	if len(key) == 0 {
		return nil, errors.New("the secret's key is empty")
	}
	return key, nil
}

// ParseSigningSecret is ParseSecret for a key to sign with: it must also be
// MinKeyBytes to MaxKeyBytes long.
func ParseSigningSecret(secret string) ([]byte, error) {
	key, err := ParseSecret(secret)
	if err != nil {
		return nil, err
	}
	if len(key) < MinKeyBytes || len(key) > MaxKeyBytes {
		return nil, fmt.Errorf("the secret's key is %d bytes: Standard Webhooks asks for %d to %d random bytes",
			len(key), MinKeyBytes, MaxKeyBytes)
	}
	return key, nil
}

// sign returns the base64 HMAC-SHA256 of "<id>.<timestamp>.<body>" under key.
func sign(key []byte, id, timestamp string, body []byte) []byte {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write([]byte(timestamp))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return mac.Sum(nil)
}

// Sign sets the headers of the scheme on h: id, the timestamp of at and,
// with keys, one v1 signature per key, in the order of keys.
func Sign(h http.Header, keys [][]byte, id string, at time.Time, body []byte) {
	ts := strconv.FormatInt(at.Unix(), 10)
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, ts)
	if len(keys) == 0 {
		return
	}
	sigs := make([]string, len(keys))
	for i, k := range keys {
		sigs[i] = "v1," + base64.StdEncoding.EncodeToString(sign(k, id, ts, body))
	}
	h.Set(HeaderSignature, strings.Join(sigs, " "))
}

// Verify checks the headers of the scheme in h against body: the
// timestamp within tolerance of now (either way), and one v1 signature of
// the list made with one of keys, compared in constant time. Signatures of
// other versions (v1a, asymmetric) are skipped. It returns nil, or an error
// matching ErrMissing, ErrTimestamp or ErrMismatch.
func Verify(h http.Header, body []byte, keys [][]byte, now time.Time, tolerance time.Duration) error {
	id, ts, list := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	for _, hv := range []struct{ name, v string }{{HeaderID, id}, {HeaderTimestamp, ts}, {HeaderSignature, list}} {
		if hv.v == "" {
			return fmt.Errorf("%w %s", ErrMissing, hv.name)
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: %q is not unix seconds", ErrTimestamp, cut(ts))
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: %s is %v from now, beyond %v", ErrTimestamp, ts, d.Round(time.Second), tolerance)
	}
	var sigs [][]byte
	for _, s := range strings.Fields(list) {
		version, value, ok := strings.Cut(s, ",")
		if !ok || version != "v1" {
			continue
		}
		if sig, err := base64.StdEncoding.DecodeString(value); err == nil {
			sigs = append(sigs, sig)
		}
	}
	for _, k := range keys {
		want := sign(k, id, ts, body)
		for _, sig := range sigs {
			if hmac.Equal(sig, want) {
				return nil
			}
		}
	}
	return fmt.Errorf("%w (%d v1 signature(s), %d key(s)): is the secret the sender's?", ErrMismatch, len(sigs), len(keys))
}

// cut shortens what a request sent, for an error.
func cut(s string) string {
	if len(s) > 32 {
		return s[:32] + "..."
	}
	return s
}
