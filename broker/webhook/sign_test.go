package webhook_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/webhook"
)

// Two Standard Webhooks secrets (24 and 32 random bytes), for rotation.
const (
	secretA = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	secretB = "whsec_3l7x5TgO0mMlvl2J5r5ZyQeAIKnSx27jqmt8Xk4qTkY="
)

// decodeSecret returns the key of a "whsec_<base64>" secret, as the spec
// serializes it.
func decodeSecret(t *testing.T, secret string) []byte {
	t.Helper()
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// verify is the receiver's side of Standard Webhooks, written from the
// spec (spec/standard-webhooks.md), not from the package: the timestamp
// within tolerance of now, and one "v1,<base64 HMAC-SHA256 of
// <webhook-id>.<webhook-timestamp>.<body>>" of the space-separated list
// made with one of keys.
func verify(h http.Header, body []byte, keys [][]byte, now time.Time, tolerance time.Duration) error {
	id, ts := h.Get("webhook-id"), h.Get("webhook-timestamp")
	if id == "" || ts == "" || h.Get("webhook-signature") == "" {
		return errors.New("unsigned")
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return err
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("timestamp %s outside the tolerance", ts)
	}
	for _, sig := range strings.Split(h.Get("webhook-signature"), " ") {
		v, b64, _ := strings.Cut(sig, ",")
		got, err := base64.StdEncoding.DecodeString(b64)
		if v != "v1" || err != nil {
			continue
		}
		for _, k := range keys {
			mac := hmac.New(sha256.New, k)
			mac.Write([]byte(id + "." + ts + "."))
			mac.Write(body)
			if hmac.Equal(got, mac.Sum(nil)) {
				return nil
			}
		}
	}
	return errors.New("no signature matches")
}

// signed is a request the publisher sent.
type signed struct {
	header http.Header
	body   []byte
}

// recorder keeps every request and answers 2xx.
type recorder struct {
	mu   sync.Mutex
	reqs []signed
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rec.mu.Lock()
	rec.reqs = append(rec.reqs, signed{r.Header.Clone(), body})
	rec.mu.Unlock()
}

func (rec *recorder) take() []signed {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	out := rec.reqs
	rec.reqs = nil
	return out
}

// TestSigned: each request carries webhook-id, webhook-timestamp (the
// publisher's clock) and one signature per secret, so that a receiver that
// knows either secret of a rotation verifies it, and one that knows
// neither, a tampered body, another id or timestamp, or a clock beyond the
// tolerance refuses it. In the mode Batch the id is BatchID of the
// messages; in PerMessage each message's event id.
func TestSigned(t *testing.T) {
	at := time.Now().Add(-time.Minute).Truncate(time.Second)
	for _, mode := range []webhook.Mode{webhook.Batch, webhook.PerMessage} {
		t.Run(string(mode), func(t *testing.T) {
			rec := &recorder{}
			srv := httptest.NewServer(rec)
			defer srv.Close()
			pub, err := webhook.NewPublisher(webhook.Config{URL: srv.URL, Mode: mode, Secrets: []string{secretB, secretA},
				Now: func() time.Time { return at }})
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			msgs := messages(t, 3)
			if err := pub.Publish(context.Background(), msgs); err != nil {
				t.Fatal(err)
			}
			reqs := rec.take()
			var wantIDs []string
			if mode == webhook.Batch {
				name := "batch:" + msgs[0].EventID.String() + "," + msgs[1].EventID.String() + "," + msgs[2].EventID.String()
				wantIDs = []string{uuid.NewSHA1(uuid.MustParse(idem.EventIDNamespace), []byte(name)).String()}
			} else {
				for _, m := range msgs {
					wantIDs = append(wantIDs, m.EventID.String())
				}
			}
			if len(reqs) != len(wantIDs) {
				t.Fatalf("%d requests, want %d", len(reqs), len(wantIDs))
			}
			keyA, keyB, other := decodeSecret(t, secretA), decodeSecret(t, secretB), []byte("not the secret of this endpoint")
			now := time.Now()
			for i, r := range reqs {
				if got := r.header.Get("webhook-id"); got != wantIDs[i] {
					t.Errorf("request %d: webhook-id %q, want %q", i, got, wantIDs[i])
				}
				if got := r.header.Get("webhook-timestamp"); got != strconv.FormatInt(at.Unix(), 10) {
					t.Errorf("request %d: webhook-timestamp %q, want %d", i, got, at.Unix())
				}
				if sigs := strings.Split(r.header.Get("webhook-signature"), " "); len(sigs) != 2 || !strings.HasPrefix(sigs[0], "v1,") || !strings.HasPrefix(sigs[1], "v1,") {
					t.Errorf("request %d: webhook-signature %q, want two v1 signatures", i, r.header.Get("webhook-signature"))
				}
				if mode == webhook.PerMessage && string(r.body) != string(msgs[i].Body) {
					t.Errorf("request %d: body %s, want the message's %s", i, r.body, msgs[i].Body)
				}
				for name, keys := range map[string][][]byte{"new secret": {keyB}, "old secret": {keyA}, "both": {other, keyA}} {
					if err := verify(r.header, r.body, keys, now, 5*time.Minute); err != nil {
						t.Errorf("request %d, receiver with the %s: %v", i, name, err)
					}
				}
				if err := verify(r.header, r.body, [][]byte{other}, now, 5*time.Minute); err == nil {
					t.Errorf("request %d verified with a key the publisher does not have", i)
				}
				tampered := append([]byte(nil), r.body...)
				tampered[len(tampered)/2] ^= 1
				if err := verify(r.header, tampered, [][]byte{keyA, keyB}, now, 5*time.Minute); err == nil {
					t.Errorf("request %d: a tampered body verified", i)
				}
				for _, h := range []string{"webhook-id", "webhook-timestamp"} {
					changed := r.header.Clone()
					changed.Set(h, changed.Get(h)+"1")
					if err := verify(changed, r.body, [][]byte{keyA, keyB}, now, time.Hour); err == nil {
						t.Errorf("request %d: verified with another %s", i, h)
					}
				}
				if err := verify(r.header, r.body, [][]byte{keyA}, at.Add(5*time.Minute+time.Second), 5*time.Minute); err == nil {
					t.Errorf("request %d: verified beyond the tolerance", i)
				}
			}
		})
	}
}

// A receiver that refuses a stale signature (401): the call fails as a
// whole, unmarked (the relay retries), since the next attempt is signed
// anew; without secrets, requests have an id and a timestamp but no
// signature.
func TestSignedRefused(t *testing.T) {
	keys := [][]byte{decodeSecret(t, secretA)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := verify(r.Header, body, keys, time.Now(), 5*time.Minute); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
		}
	}))
	defer srv.Close()
	var clock time.Time
	pub, err := webhook.NewPublisher(webhook.Config{URL: srv.URL, Mode: webhook.PerMessage, Secrets: []string{secretA},
		Now: func() time.Time { return clock }})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	clock = time.Now().Add(-10 * time.Minute)
	err = pub.Publish(context.Background(), messages(t, 2))
	var be *broker.BatchError
	if err == nil || broker.IsRefused(err) || errors.As(err, &be) || !strings.Contains(err.Error(), "status 401") {
		t.Fatalf("Publish signed 10 minutes ago = %v, want a whole-call failure with the 401", err)
	}
	clock = time.Now()
	if err := pub.Publish(context.Background(), messages(t, 2)); err != nil {
		t.Fatalf("Publish signed now: %v", err)
	}

	rec := &recorder{}
	plain := httptest.NewServer(rec)
	defer plain.Close()
	unsigned := webhook.New(plain.URL, nil)
	defer unsigned.Close()
	if err := unsigned.Publish(context.Background(), messages(t, 1)); err != nil {
		t.Fatal(err)
	}
	for _, r := range rec.take() {
		if r.header.Get("webhook-signature") != "" || r.header.Get("webhook-id") == "" || r.header.Get("webhook-timestamp") == "" {
			t.Errorf("unsigned publisher sent %v", r.header)
		}
	}
}

// NewPublisher refuses a secret that is not one, or too short to sign
// with, without quoting it.
func TestNewPublisherSecrets(t *testing.T) {
	for _, s := range []string{"S3cret", "whsec_S3cret", "whsec_" + base64.StdEncoding.EncodeToString([]byte("S3cret-short"))} {
		_, err := webhook.NewPublisher(webhook.Config{URL: "https://hooks.example.com/", Secrets: []string{secretA, s}})
		if err == nil || !strings.Contains(err.Error(), "Config.Secrets[1]") || strings.Contains(err.Error(), "S3cret") {
			t.Errorf("secret %q: %v, want an error naming Config.Secrets[1] without the secret", s, err)
		}
	}
}

// In the mode PerMessage a message header that HTTP cannot carry refuses
// that message alone; its neighbours are sent.
func TestPerMessageHeaders(t *testing.T) {
	rec := &recorder{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	pub, err := webhook.NewPublisher(webhook.Config{URL: srv.URL, Mode: webhook.PerMessage})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	msgs := messages(t, 4)
	msgs[0].Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	msgs[1].Headers = map[string]string{"cloudEvents:id": "x"}
	msgs[2].Headers = map[string]string{"webhook-signature": "v1,forged"}
	msgs[3].Headers = map[string]string{"note": "two\nlines"}
	err = pub.Publish(context.Background(), msgs)
	var be *broker.BatchError
	if !errors.As(err, &be) {
		t.Fatalf("Publish = %v, want a *broker.BatchError", err)
	}
	if be.Errs[0] != nil {
		t.Errorf("message 0: %v", be.Errs[0])
	}
	for i := 1; i < 4; i++ {
		if e := be.Errs[i]; !broker.IsRefused(e) || broker.IsFault(e) {
			t.Errorf("message %d: %v, want a refusal", i, e)
		}
	}
	reqs := rec.take()
	if len(reqs) != 1 || reqs[0].header.Get("Traceparent") != msgs[0].Headers["traceparent"] || reqs[0].header.Get("Content-Type") != "application/json" {
		t.Errorf("requests: %+v", reqs)
	}
}

// In the mode PerMessage a failure that is no refusal stops the call: the
// messages before it are accepted, it and the rest are faults.
func TestPerMessageStops(t *testing.T) {
	msgs := messages(t, 4)
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, r.Header.Get("webhook-id"))
		if r.Header.Get("webhook-id") == msgs[2].EventID.String() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	pub, err := webhook.NewPublisher(webhook.Config{URL: srv.URL, Mode: webhook.PerMessage, Secrets: []string{secretA}})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	err = pub.Publish(context.Background(), msgs)
	var be *broker.BatchError
	if !errors.As(err, &be) || be.Errs[0] != nil || be.Errs[1] != nil || !broker.IsFault(be.Errs[2]) || !broker.IsFault(be.Errs[3]) {
		t.Fatalf("Publish = %v, want the first two accepted, the others faults", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 3 || got[0] != msgs[0].EventID.String() || got[2] != msgs[2].EventID.String() {
		t.Errorf("requests for %v, want the first three messages in order", got)
	}
}
