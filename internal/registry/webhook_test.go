package registry

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem"
)

// A webhook URL signs with the secrets of its file, posts one message per
// request with mode=message, and keeps idem's parameters to itself; a
// secret in the URL is refused, its value masked in the error.
func TestOpenWebhook(t *testing.T) {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	file := filepath.Join(t.TempDir(), "wh")
	if err := os.WriteFile(file, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	type request struct{ query, id, ts, sig, body string }
	got := make(chan request, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- request{r.URL.RawQuery, r.Header.Get("webhook-id"), r.Header.Get("webhook-timestamp"), r.Header.Get("webhook-signature"), string(body)}
	}))
	defer srv.Close()
	pub, err := Open(context.Background(), srv.URL+"/hooks?token=t&mode=message&secret_file="+file)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	ev, _ := idem.NewEvent("order.order.placed.v1", "order", "42", map[string]int{"lines": 2})
	msg, _ := idem.NewMessage(ev)
	if err := pub.Publish(context.Background(), []idem.Message{msg}); err != nil {
		t.Fatal(err)
	}
	r := <-got
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(r.id + "." + r.ts + "." + r.body))
	if r.query != "token=t" || r.id != ev.ID.String() || r.body != string(msg.Body) ||
		r.sig != "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)) {
		t.Errorf("request %+v: want the endpoint's query only, the event id, the envelope, a signature with the file's secret", r)
	}

	_, err = Open(context.Background(), srv.URL+"/hooks?secret=whsec_S3cretS3cretS3cretS3cretS3cret")
	if err == nil || strings.Contains(err.Error(), "S3cret") || !strings.Contains(err.Error(), "secret_file=PATH") {
		t.Errorf("Open with secret=: %v; want a refusal pointing to secret_file, without the secret", err)
	}
}
