package webhookin_test

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox/webhookin"
)

// FuzzProviders reads any headers and body with each provider: no panic;
// Verify refuses with ErrSignature what it does not verify, and verifies
// the body signed by the sender's algorithm (written in the tests);
// Event's errors are undecodable (parked, never retried) and its id and
// type are never empty without one.
func FuzzProviders(f *testing.F) {
	f.Add("msg_1", "1614265330", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", "t=1,v1=00", "sha256=00", []byte(`{"test": 2432232314}`))
	f.Add("", "", "", "", "", []byte(``))
	f.Add("msg_2", "x", "v1, v1a,= ,,", "t=,v1=,v1", "sha256=zz", []byte(`{"type":"a","id":"evt_1"}`))
	f.Add("m", "-9223372036854775808", "v1,!!!", "t=9223372036854775807", "sha256=", []byte(`{"type":1,"event_name":"x"}`))
	f.Add("m", "1", "v1", "v1=aa,t=1", "sha1=00", []byte("\xff{\"id\":\"evt\"}"))
	now := time.Unix(1614265330, 0)
	providers := []webhookin.Provider{
		webhookin.StandardWebhooks{Secrets: []string{swSecret}},
		webhookin.Stripe{Secrets: []string{stripeSecret}},
		webhookin.GitHub{Secrets: []string{githubSecret}},
	}
	f.Fuzz(func(t *testing.T, id, ts, sig, stripeSig, hubSig string, body []byte) {
		h := http.Header{"Webhook-Id": {id}, "Webhook-Timestamp": {ts}, "Webhook-Signature": {sig},
			"Stripe-Signature": {stripeSig}, "X-Hub-Signature-256": {hubSig}, "X-Github-Delivery": {id}, "X-Github-Event": {ts}}
		for _, p := range providers {
			if err := p.Verify(h, body, now); err != nil && !errors.Is(err, webhookin.ErrSignature) {
				t.Errorf("%T.Verify: %v, want nil or ErrSignature", p, err)
			}
			gotID, name, err := p.Event(h, body)
			if err != nil && !errors.Is(err, idem.ErrUndecodable) {
				t.Errorf("%T.Event: %v, want an undecodable error", p, err)
			}
			if err == nil && (gotID == "" || name == "") {
				t.Errorf("%T.Event = %q, %q without an error", p, gotID, name)
			}
		}
		if id != "" {
			if err := providers[0].Verify(signSW(id, now, body, swSecret), body, now); err != nil {
				t.Errorf("StandardWebhooks: a body signed with the secret: %v", err)
			}
		}
		if err := providers[1].Verify(signStripe(now, body, stripeSecret), body, now); err != nil {
			t.Errorf("Stripe: a body signed with the secret: %v", err)
		}
	})
}
