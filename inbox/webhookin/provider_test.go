package webhookin_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox/webhookin"
)

// Secrets of the tests: Standard Webhooks' (24 and 32 random bytes), and
// Stripe's and GitHub's as their dashboards show them.
const (
	swSecret     = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	swSecretNext = "whsec_3l7x5TgO0mMlvl2J5r5ZyQeAIKnSx27jqmt8Xk4qTkY="
	stripeSecret = "whsec_test_1f4c0f3b3e0e4b6aa8d0"
	githubSecret = "It's a Secret to Everybody"
)

func hmacSHA256(key, msg []byte) []byte {
	mac := hmac.New(sha256.New, key)
	mac.Write(msg)
	return mac.Sum(nil)
}

// signSW returns the headers of a request signed as the Standard Webhooks
// spec (spec/standard-webhooks.md) says, written here from the spec: the
// key is the base64 after "whsec_"; each signature "v1," and the base64 of
// HMAC-SHA256 over "<id>.<timestamp>.<body>"; several space-separated.
func signSW(id string, at time.Time, body []byte, secrets ...string) http.Header {
	ts := strconv.FormatInt(at.Unix(), 10)
	var sigs []string
	for _, s := range secrets {
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, "whsec_"))
		if err != nil {
			panic(err)
		}
		sigs = append(sigs, "v1,"+base64.StdEncoding.EncodeToString(hmacSHA256(key, []byte(id+"."+ts+"."+string(body)))))
	}
	return http.Header{"Webhook-Id": {id}, "Webhook-Timestamp": {ts}, "Webhook-Signature": {strings.Join(sigs, " ")},
		"Content-Type": {"application/json"}}
}

// signStripe returns the header Stripe signs with, from its documentation:
// t=<unix seconds>,v1=<hex of HMAC-SHA256, keyed with the endpoint secret,
// of "<t>.<body>">, one v1 per secret.
func signStripe(at time.Time, body []byte, secrets ...string) http.Header {
	ts := strconv.FormatInt(at.Unix(), 10)
	parts := []string{"t=" + ts}
	for _, s := range secrets {
		parts = append(parts, "v1="+hex.EncodeToString(hmacSHA256([]byte(s), []byte(ts+"."+string(body)))))
	}
	return http.Header{"Stripe-Signature": {strings.Join(parts, ",")}, "Content-Type": {"application/json; charset=utf-8"}}
}

// signGitHub returns a request signed as GitHub signs: X-Hub-Signature-256
// "sha256=" and the hex of HMAC-SHA256 of the body, keyed with the secret.
func signGitHub(t *testing.T, body []byte, delivery, event string) *http.Request {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/webhooks/github", bytes.NewReader(body))
	req.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(hmacSHA256([]byte(githubSecret), body)))
	req.Header.Set("X-GitHub-Delivery", delivery)
	req.Header.Set("X-GitHub-Event", event)
	return req
}

// serve returns the status h answers req with.
func serve(h http.Handler, req *http.Request) int {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code
}

// TestStandardWebhooks: the reference libraries' test vector verifies; a
// request signed with the old or the new secret of a rotation verifies;
// a tampered body, another id, an unknown secret or a timestamp beyond the
// tolerance (either way) is refused with ErrSignature.
func TestStandardWebhooks(t *testing.T) {
	p := webhookin.StandardWebhooks{Secrets: []string{swSecret, swSecretNext}}
	vector := http.Header{"Webhook-Id": {"msg_p5jXN8AQM9LWM0D4loKWxJek"}, "Webhook-Timestamp": {"1614265330"},
		"Webhook-Signature": {"v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="}}
	if err := p.Verify(vector, []byte(`{"test": 2432232314}`), time.Unix(1614265330, 0)); err != nil {
		t.Errorf("the reference vector: %v", err)
	}
	now := time.Now()
	body := []byte(`{"type":"invoice.paid","timestamp":"2026-01-02T08:00:00Z","data":{"id":"in_1"}}`)
	for name, c := range map[string]struct {
		h    http.Header
		body []byte
		now  time.Time
		ok   bool
	}{
		"old secret":     {signSW("msg_1", now, body, swSecret), body, now, true},
		"new secret":     {signSW("msg_1", now, body, swSecretNext), body, now, true},
		"both":           {signSW("msg_1", now, body, "whsec_"+base64.StdEncoding.EncodeToString([]byte("another endpoint's key 24")), swSecretNext), body, now, true},
		"4m59s old":      {signSW("msg_1", now.Add(-5*time.Minute+time.Second), body, swSecret), body, now, true},
		"unknown secret": {signSW("msg_1", now, body, "whsec_"+base64.StdEncoding.EncodeToString([]byte("another endpoint's key 24"))), body, now, false},
		"tampered body":  {signSW("msg_1", now, body, swSecret), []byte(strings.Replace(string(body), "in_1", "in_2", 1)), now, false},
		"6m old":         {signSW("msg_1", now.Add(-6*time.Minute), body, swSecret), body, now, false},
		"6m ahead":       {signSW("msg_1", now.Add(6*time.Minute), body, swSecret), body, now, false},
		"unsigned":       {http.Header{"Webhook-Id": {"msg_1"}, "Webhook-Timestamp": {strconv.FormatInt(now.Unix(), 10)}}, body, now, false},
		"other id":       {func() http.Header { h := signSW("msg_1", now, body, swSecret); h.Set("webhook-id", "msg_2"); return h }(), body, now, false},
	} {
		err := p.Verify(c.h, c.body, c.now)
		if c.ok && err != nil {
			t.Errorf("%s: %v, want verified", name, err)
		}
		if !c.ok && !errors.Is(err, webhookin.ErrSignature) {
			t.Errorf("%s: %v, want ErrSignature", name, err)
		}
	}
	if err := (webhookin.StandardWebhooks{Secrets: []string{swSecret}, Tolerance: 10 * time.Minute}).Verify(signSW("msg_1", now.Add(-6*time.Minute), body, swSecret), body, now); err != nil {
		t.Errorf("6m old within a tolerance of 10m: %v", err)
	}

	for _, c := range []struct {
		body, id, name, err string
	}{
		{string(body), "msg_1", "invoice.paid", ""},
		{`{"event_id":"0193","event_name":"order.order.placed.v1","payload":{}}`, "msg_1", "order.order.placed.v1", ""},
		{`{"data":{}}`, "msg_1", "", `type is missing`},
		{`{"type":3}`, "msg_1", "", `type is not a string`},
		{`not json`, "msg_1", "", `body is not a JSON object`},
	} {
		id, name, err := p.Event(http.Header{"Webhook-Id": {"msg_1"}}, []byte(c.body))
		if c.err == "" && (err != nil || id != c.id || name != c.name) {
			t.Errorf("Event(%s) = %q, %q, %v; want %q, %q", c.body, id, name, err, c.id, c.name)
		}
		if c.err != "" && (!errors.Is(err, idem.ErrUndecodable) || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("Event(%s): %v, want an undecodable error with %q", c.body, err, c.err)
		}
	}
}

// TestStripe: Stripe's scheme as its documentation describes it, computed
// in the test; a secret rolled (two v1), a tampered body, an old
// timestamp; the event's id and type from the body.
func TestStripe(t *testing.T) {
	p := webhookin.Stripe{Secrets: []string{stripeSecret}}
	now := time.Now()
	body := []byte(`{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","object":"event","type":"payment_intent.succeeded","data":{"object":{"id":"pi_1"}}}`)
	for name, c := range map[string]struct {
		h    http.Header
		body []byte
		ok   bool
	}{
		"signed":         {signStripe(now, body, stripeSecret), body, true},
		"rolled":         {signStripe(now, body, "whsec_old", stripeSecret), body, true},
		"other secret":   {signStripe(now, body, "whsec_old"), body, false},
		"tampered":       {signStripe(now, body, stripeSecret), append([]byte(" "), body...), false},
		"6m old":         {signStripe(now.Add(-6*time.Minute), body, stripeSecret), body, false},
		"no timestamp":   {http.Header{"Stripe-Signature": {"v1=" + hex.EncodeToString(hmacSHA256([]byte(stripeSecret), body))}}, body, false},
		"no header":      {http.Header{}, body, false},
		"v0 only":        {http.Header{"Stripe-Signature": {strings.Replace(signStripe(now, body, stripeSecret).Get("Stripe-Signature"), "v1=", "v0=", 1)}}, body, false},
		"garbled header": {http.Header{"Stripe-Signature": {"t=,v1=zz,,="}}, body, false},
	} {
		err := p.Verify(c.h, c.body, now)
		if c.ok && err != nil {
			t.Errorf("%s: %v, want verified", name, err)
		}
		if !c.ok && !errors.Is(err, webhookin.ErrSignature) {
			t.Errorf("%s: %v, want ErrSignature", name, err)
		}
	}
	if id, name, err := p.Event(nil, body); err != nil || id != "evt_1NG8Du2eZvKYlo2CUI79vXWy" || name != "payment_intent.succeeded" {
		t.Errorf("Event = %q, %q, %v", id, name, err)
	}
	for _, b := range []string{`{"type":"x"}`, `{"id":"evt_1"}`, `[]`, ``} {
		if _, _, err := p.Event(nil, []byte(b)); !errors.Is(err, idem.ErrUndecodable) {
			t.Errorf("Event(%s): %v, want undecodable", b, err)
		}
	}
}

// TestGitHub: the example of GitHub's documentation ("Validating webhook
// deliveries": the secret "It's a Secret to Everybody", the payload "Hello,
// World!"), a rotated secret, a tampered body; the event's id and type
// from X-GitHub-Delivery and X-GitHub-Event.
func TestGitHub(t *testing.T) {
	p := webhookin.GitHub{Secrets: []string{"the old one", githubSecret}}
	doc := http.Header{"X-Hub-Signature-256": {"sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"}}
	if err := p.Verify(doc, []byte("Hello, World!"), time.Time{}); err != nil {
		t.Errorf("the documentation's example: %v", err)
	}
	for name, c := range map[string]struct {
		h    http.Header
		body string
	}{
		"tampered":   {doc, "Hello, World?"},
		"sha1 only":  {http.Header{"X-Hub-Signature": {"sha1=01dc10d0c83e72ed246219cdd91669667fe2ca59"}}, "Hello, World!"},
		"not hex":    {http.Header{"X-Hub-Signature-256": {"sha256=zz"}}, "Hello, World!"},
		"other hash": {http.Header{"X-Hub-Signature-256": {"sha256=" + hex.EncodeToString(hmacSHA256([]byte("not it"), []byte("Hello, World!")))}}, "Hello, World!"},
	} {
		if err := p.Verify(c.h, []byte(c.body), time.Time{}); !errors.Is(err, webhookin.ErrSignature) {
			t.Errorf("%s: %v, want ErrSignature", name, err)
		}
	}
	h := http.Header{"X-Github-Delivery": {"72d3162e-cc78-11e3-81ab-4c9367dc0958"}, "X-Github-Event": {"issues"}}
	if id, name, err := p.Event(h, nil); err != nil || id != "72d3162e-cc78-11e3-81ab-4c9367dc0958" || name != "issues" {
		t.Errorf("Event = %q, %q, %v", id, name, err)
	}
	if _, _, err := p.Event(http.Header{"X-Github-Event": {"issues"}}, nil); !errors.Is(err, idem.ErrUndecodable) {
		t.Errorf("Event without X-GitHub-Delivery: %v, want undecodable", err)
	}
}

// New refuses a provider without secrets, or with one that is not a
// secret, without quoting it.
func TestNewChecksProvider(t *testing.T) {
	c := newConsumerForConfig(t)
	for _, p := range []webhookin.Provider{
		nil,
		webhookin.StandardWebhooks{},
		webhookin.StandardWebhooks{Secrets: []string{"whsec_S3cret!"}},
		webhookin.StandardWebhooks{Secrets: []string{swSecret}, Tolerance: -time.Second},
		webhookin.Stripe{Secrets: []string{""}},
		webhookin.GitHub{},
	} {
		_, err := webhookin.New(c, webhookin.Config{Provider: p})
		if err == nil || !strings.HasPrefix(err.Error(), "idem: webhookin: ") || strings.Contains(err.Error(), "S3cret") {
			t.Errorf("New with %#v: %v; want an error naming the field, without the secret", p, err)
		}
	}
}
