package stdwebhook_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idem-go/idem/internal/stdwebhook"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The test vector of the Standard Webhooks reference libraries.
const (
	vectorSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	vectorID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	vectorTimestamp = 1614265330
	vectorBody      = `{"test": 2432232314}`
	vectorSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

func key(t *testing.T, secret string) []byte {
	t.Helper()
	k, err := stdwebhook.ParseSecret(secret)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Sign and Verify agree with the reference libraries' vector.
func TestVector(t *testing.T) {
	at := time.Unix(vectorTimestamp, 0)
	h := http.Header{}
	stdwebhook.Sign(h, [][]byte{key(t, vectorSecret)}, vectorID, at, []byte(vectorBody))
	if got := h.Get("webhook-signature"); got != vectorSignature {
		t.Errorf("webhook-signature = %q, want %q", got, vectorSignature)
	}
	if h.Get("webhook-id") != vectorID || h.Get("webhook-timestamp") != "1614265330" {
		t.Errorf("headers = %v", h)
	}
	h = http.Header{"Webhook-Id": {vectorID}, "Webhook-Timestamp": {"1614265330"},
		"Webhook-Signature": {"v1a,aGVsbG8= v1,bm90IGl0 " + vectorSignature}}
	if err := stdwebhook.Verify(h, []byte(vectorBody), [][]byte{key(t, "whsec_"+strings.Repeat("A", 32)), key(t, vectorSecret)}, at.Add(time.Minute), 5*time.Minute); err != nil {
		t.Errorf("Verify of the vector among other signatures and keys: %v", err)
	}
}

// Verify refuses what the scheme does not vouch for.
func TestVerifyRefuses(t *testing.T) {
	at := time.Unix(vectorTimestamp, 0)
	keys := [][]byte{key(t, vectorSecret)}
	good := func() http.Header {
		return http.Header{"Webhook-Id": {vectorID}, "Webhook-Timestamp": {"1614265330"}, "Webhook-Signature": {vectorSignature}}
	}
	for _, c := range []struct {
		name   string
		change func(http.Header) ([]byte, time.Time)
		want   error
	}{
		{"tampered body", func(http.Header) ([]byte, time.Time) { return []byte(`{"test": 2432232315}`), at }, stdwebhook.ErrMismatch},
		{"other id", func(h http.Header) ([]byte, time.Time) {
			h.Set("webhook-id", "msg_other")
			return []byte(vectorBody), at
		}, stdwebhook.ErrMismatch},
		{"other timestamp", func(h http.Header) ([]byte, time.Time) {
			h.Set("webhook-timestamp", "1614265331")
			return []byte(vectorBody), at
		}, stdwebhook.ErrMismatch},
		{"v1a only", func(h http.Header) ([]byte, time.Time) {
			h.Set("webhook-signature", "v1a"+strings.TrimPrefix(vectorSignature, "v1"))
			return []byte(vectorBody), at
		}, stdwebhook.ErrMismatch},
		{"too old", func(http.Header) ([]byte, time.Time) { return []byte(vectorBody), at.Add(5*time.Minute + time.Second) }, stdwebhook.ErrTimestamp},
		{"too far ahead", func(http.Header) ([]byte, time.Time) { return []byte(vectorBody), at.Add(-5*time.Minute - time.Second) }, stdwebhook.ErrTimestamp},
		{"timestamp not a number", func(h http.Header) ([]byte, time.Time) {
			h.Set("webhook-timestamp", "1614265330.0")
			return []byte(vectorBody), at
		}, stdwebhook.ErrTimestamp},
		{"no signature", func(h http.Header) ([]byte, time.Time) {
			h.Del("webhook-signature")
			return []byte(vectorBody), at
		}, stdwebhook.ErrMissing},
		{"no id", func(h http.Header) ([]byte, time.Time) {
			h.Del("webhook-id")
			return []byte(vectorBody), at
		}, stdwebhook.ErrMissing},
	} {
		h := good()
		body, now := c.change(h)
		if err := stdwebhook.Verify(h, body, keys, now, 5*time.Minute); !errors.Is(err, c.want) {
			t.Errorf("%s: Verify = %v, want %v", c.name, err, c.want)
		}
	}
	if err := stdwebhook.Verify(good(), []byte(vectorBody), keys, at.Add(5*time.Minute), 5*time.Minute); err != nil {
		t.Errorf("at the edge of the tolerance: %v", err)
	}
}

// Secrets: whsec_ then base64; the signing ones 24 to 64 bytes; errors
// never quote them.
func TestParseSecret(t *testing.T) {
	if _, err := stdwebhook.ParseSecret("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"); err != nil {
		t.Errorf("without the prefix: %v", err)
	}
	for _, s := range []string{"", "whsec_", "whsec_S3cret!!", "whsec_S3cretS3cret="} {
		_, err := stdwebhook.ParseSecret(s)
		if err == nil {
			t.Errorf("ParseSecret(%q) = nil, want an error", s)
		} else if s != "" && strings.Contains(err.Error(), "S3cret") {
			t.Errorf("ParseSecret(%q): %v quotes the secret", s, err)
		}
	}
	if _, err := stdwebhook.ParseSigningSecret("whsec_" + "c2hvcnQ="); err == nil || !strings.Contains(err.Error(), "24 to 64") {
		t.Errorf("a 5-byte signing key: %v, want a refusal", err)
	}
	if _, err := stdwebhook.ParseSigningSecret(vectorSecret); err != nil {
		t.Errorf("a 24-byte signing key: %v", err)
	}
}
