package webhookin

import (
	"cmp"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/stdwebhook"
)

// Provider is a webhook sender's scheme: how it signs its requests, and
// where a request carries the event's id and type. StandardWebhooks,
// Stripe and GitHub implement it; another sender's scheme is a type with
// these two methods.
type Provider interface {
	// Verify returns nil when the request, its headers and its body
	// exactly as received, was signed by the sender with one of the
	// provider's secrets and, if the scheme has a timestamp, within its
	// tolerance of now; else an error (wrap ErrSignature), answered 401
	// with nothing stored. Its error must not quote a secret.
	Verify(header http.Header, body []byte, now time.Time) error
	// Event returns, for a verified request, the sender's id of the event
	// (the same in every attempt: the deduplication key, through
	// idem.EventID) and its type (the event name handlers are registered
	// for). An error means that the request can never be handled: it is
	// parked in the failure store, as undecodable, and acknowledged.
	Event(header http.Header, body []byte) (id, name string, err error)
}

// ErrSignature is matched (errors.Is) by the errors of the Verify methods
// of this package's providers: the request is not the sender's, or too old.
var ErrSignature = errors.New("idem: webhookin: signature not verified")

// ToleranceDefault is how far a request's timestamp may be from now, either
// way, in the schemes that sign one (StandardWebhooks, Stripe): beyond it,
// a request is taken for a replay.
const ToleranceDefault = 5 * time.Minute

// checker is implemented by the providers of this package, whose
// configuration New checks.
type checker interface{ check() error }

// undecodable returns the error of a request whose field cannot be read:
// an undecodable message (idem.ErrUndecodable).
func undecodable(field, problem string) error {
	return &idem.DecodeError{Err: &idem.FieldError{Field: field, Problem: problem}}
}

// jsonFields reads the string fields of a JSON object body; names absent
// are "". A body that is not a JSON object, or a field that is not a
// string, is undecodable.
func jsonFields(body []byte, names ...string) ([]string, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil || obj == nil {
		return nil, undecodable("body", "is not a JSON object")
	}
	out := make([]string, len(names))
	for i, n := range names {
		raw, ok := obj[n]
		if !ok {
			continue
		}
		if err := json.Unmarshal(raw, &out[i]); err != nil {
			return nil, undecodable(n, "is not a string")
		}
	}
	return out, nil
}

// checkSecrets checks that secrets holds at least one secret, none empty.
func checkSecrets(provider string, secrets []string) error {
	if len(secrets) == 0 {
		return fmt.Errorf("idem: webhookin: %s.Secrets is empty: give the sender's signing secret (read from a file or a variable, never written in code)", provider)
	}
	for i, s := range secrets {
		if strings.TrimSpace(s) == "" {
			return fmt.Errorf("idem: webhookin: %s.Secrets[%d] is empty", provider, i)
		}
	}
	return nil
}

// StandardWebhooks verifies requests signed as Standard Webhooks specifies
// (https://www.standardwebhooks.com/): webhook-id, webhook-timestamp and
// webhook-signature, a space-separated list of "v1,<base64 HMAC-SHA256 of
// <id>.<timestamp>.<body>>", one of which must be made with one of
// Secrets. broker/webhook signs so; Svix and the senders that follow the
// spec too.
//
// The event's id is webhook-id; its type is the body's "type" (the spec's
// payload structure), or, for the JSON envelope broker/webhook sends in
// its mode PerMessage, its "event_name".
type StandardWebhooks struct {
	// Secrets are the sender's secrets, "whsec_<base64>" (the prefix is
	// optional): a request signed with any of them is verified, so that
	// the sender can rotate (give the old and the new one meanwhile).
	// Required.
	Secrets []string
	// Tolerance is how far webhook-timestamp may be from now, either way.
	// Defaults to ToleranceDefault (5m).
	Tolerance time.Duration
}

func (p StandardWebhooks) keys() ([][]byte, error) {
	if err := checkSecrets("StandardWebhooks", p.Secrets); err != nil {
		return nil, err
	}
	keys := make([][]byte, len(p.Secrets))
	for i, s := range p.Secrets {
		k, err := stdwebhook.ParseSecret(s)
		if err != nil {
			return nil, fmt.Errorf("idem: webhookin: StandardWebhooks.Secrets[%d]: %w", i, err)
		}
		keys[i] = k
	}
	return keys, nil
}

func (p StandardWebhooks) check() error {
	if p.Tolerance < 0 {
		return fmt.Errorf("idem: webhookin: StandardWebhooks.Tolerance %v is negative", p.Tolerance)
	}
	_, err := p.keys()
	return err
}

// Verify implements Provider.
func (p StandardWebhooks) Verify(header http.Header, body []byte, now time.Time) error {
	keys, err := p.keys()
	if err != nil {
		return err
	}
	if err := stdwebhook.Verify(header, body, keys, now, cmp.Or(p.Tolerance, ToleranceDefault)); err != nil {
		return fmt.Errorf("%w: %w", ErrSignature, err)
	}
	return nil
}

// Event implements Provider.
func (p StandardWebhooks) Event(header http.Header, body []byte) (id, name string, err error) {
	id = header.Get(stdwebhook.HeaderID)
	if id == "" {
		return "", "", undecodable(stdwebhook.HeaderID, "is missing")
	}
	f, err := jsonFields(body, "type", "event_name")
	if err != nil {
		return id, "", err
	}
	name = cmp.Or(f[0], f[1])
	if name == "" {
		return id, "", undecodable("type", `is missing: the body has neither "type" nor "event_name"`)
	}
	return id, name, nil
}

// Stripe verifies requests signed as Stripe signs its webhooks: the header
// Stripe-Signature, "t=<unix seconds>,v1=<hex>[,v1=<hex>...]", each v1 an
// HMAC-SHA256, keyed with the endpoint's signing secret (whsec_..., used
// as it is), of "<t>.<body>"; one must match, and t be within Tolerance of
// now. The event's id and type are the body's "id" (evt_...) and "type"
// (payment_intent.succeeded...).
type Stripe struct {
	// Secrets are the endpoint's signing secrets: a request signed with any
	// of them is verified (Stripe signs with two while a secret is rolled).
	// Required.
	Secrets []string
	// Tolerance is how far t may be from now, either way. Defaults to
	// ToleranceDefault (5m), Stripe's own.
	Tolerance time.Duration
}

func (p Stripe) check() error {
	if p.Tolerance < 0 {
		return fmt.Errorf("idem: webhookin: Stripe.Tolerance %v is negative", p.Tolerance)
	}
	return checkSecrets("Stripe", p.Secrets)
}

// Verify implements Provider.
func (p Stripe) Verify(header http.Header, body []byte, now time.Time) error {
	if err := checkSecrets("Stripe", p.Secrets); err != nil {
		return err
	}
	sh := header.Get("Stripe-Signature")
	if sh == "" {
		return fmt.Errorf("%w: no Stripe-Signature header", ErrSignature)
	}
	var ts string
	var sigs [][]byte
	for _, part := range strings.Split(sh, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			if sig, err := hex.DecodeString(v); err == nil {
				sigs = append(sigs, sig)
			}
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: Stripe-Signature has no timestamp t", ErrSignature)
	}
	tolerance := cmp.Or(p.Tolerance, ToleranceDefault)
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: Stripe-Signature's t=%s is %v from now, beyond %v", ErrSignature, ts, d.Round(time.Second), tolerance)
	}
	for _, s := range p.Secrets {
		mac := hmac.New(sha256.New, []byte(s))
		mac.Write([]byte(ts))
		mac.Write([]byte{'.'})
		mac.Write(body)
		want := mac.Sum(nil)
		for _, sig := range sigs {
			if hmac.Equal(sig, want) {
				return nil
			}
		}
	}
	return fmt.Errorf("%w: no v1 signature of Stripe-Signature matches (%d signature(s), %d secret(s)): is the secret this endpoint's?", ErrSignature, len(sigs), len(p.Secrets))
}

// Event implements Provider.
func (p Stripe) Event(_ http.Header, body []byte) (id, name string, err error) {
	f, err := jsonFields(body, "id", "type")
	if err != nil {
		return "", "", err
	}
	switch {
	case f[0] == "":
		return "", "", undecodable("id", "is missing")
	case f[1] == "":
		return f[0], "", undecodable("type", "is missing")
	}
	return f[0], f[1], nil
}

// GitHub verifies requests signed as GitHub signs its webhooks: the header
// X-Hub-Signature-256, "sha256=<hex of HMAC-SHA256 of the body>", keyed
// with the webhook's secret. The scheme has no timestamp: a request
// replayed later verifies, and is a duplicate of its delivery. The event's
// id is X-GitHub-Delivery (a GUID, the same when GitHub redelivers) and
// its type X-GitHub-Event (push, pull_request...; the action is in the
// body).
type GitHub struct {
	// Secrets are the webhook's secrets: a request signed with any of them
	// is verified (give the old and the new one while changing it).
	// Required.
	Secrets []string
}

func (p GitHub) check() error { return checkSecrets("GitHub", p.Secrets) }

// Verify implements Provider.
func (p GitHub) Verify(header http.Header, body []byte, _ time.Time) error {
	if err := checkSecrets("GitHub", p.Secrets); err != nil {
		return err
	}
	v, ok := strings.CutPrefix(header.Get("X-Hub-Signature-256"), "sha256=")
	if !ok {
		return fmt.Errorf("%w: no X-Hub-Signature-256: sha256=... header", ErrSignature)
	}
	sig, err := hex.DecodeString(v)
	if err != nil {
		return fmt.Errorf("%w: X-Hub-Signature-256 is not hexadecimal", ErrSignature)
	}
	for _, s := range p.Secrets {
		mac := hmac.New(sha256.New, []byte(s))
		mac.Write(body)
		if hmac.Equal(sig, mac.Sum(nil)) {
			return nil
		}
	}
	return fmt.Errorf("%w: X-Hub-Signature-256 does not match (%d secret(s)): is the secret this webhook's?", ErrSignature, len(p.Secrets))
}

// Event implements Provider.
func (p GitHub) Event(header http.Header, _ []byte) (id, name string, err error) {
	id, name = header.Get("X-GitHub-Delivery"), header.Get("X-GitHub-Event")
	switch {
	case id == "":
		return "", "", undecodable("X-GitHub-Delivery header", "is missing")
	case name == "":
		return id, "", undecodable("X-GitHub-Event header", "is missing")
	}
	return id, name, nil
}
