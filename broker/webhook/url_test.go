package webhook_test

import (
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem/broker/webhook"
)

func TestParseURL(t *testing.T) {
	for _, raw := range []string{
		"http://127.0.0.1:8080/events",
		"https://hooks.example.com/idem?token=abc",
		"HTTPS://u:p@hooks.example.com",
		"https://hooks.example.com/cb?a=1;b=2&c=%zz",
	} {
		u, err := webhook.ParseURL(raw)
		if err != nil || u.URL != raw {
			t.Errorf("ParseURL(%q) = %q, %v; want the URL as it is", raw, u.URL, err)
		}
	}
}

func TestParseURLErrors(t *testing.T) {
	for _, c := range []struct {
		url, want string // want: in the error
	}{
		{"http://u:s3cret@h/%zz", "invalid URL escape"},
		{"ftp://u:s3cret@h/events", `scheme "ftp": want http or https`},
		{"hooks.example.com/events", `scheme "": want http or https`},
		{"http://", "no host"},
		{"https:///events", "no host"},
	} {
		_, err := webhook.ParseURL(c.url)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "idem: webhook: ") {
			t.Errorf("ParseURL(%q): %v; want an error with %q", c.url, err, c.want)
		} else if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("ParseURL(%q): %v shows the password", c.url, err)
		}
	}
}

// TestParseURLParams: idem's parameters are read and taken out of the
// URL; the endpoint's stay, in order, as written.
func TestParseURLParams(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "wh")
	if err := os.WriteFile(file, []byte(secretA+"\n"+secretB+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("IDEM_TEST_WEBHOOK_SECRET", " "+secretB+" ")
	u, err := webhook.ParseURL("https://hooks.example.com/idem?b=2&secret_file=" + file + "&a=%201&mode=message&secret_env=IDEM_TEST_WEBHOOK_SECRET#frag")
	if err != nil {
		t.Fatal(err)
	}
	if u.URL != "https://hooks.example.com/idem?b=2&a=%201#frag" || u.Mode != webhook.PerMessage {
		t.Errorf("URL %q, mode %q", u.URL, u.Mode)
	}
	if len(u.Secrets) != 3 || u.Secrets[0] != secretA || u.Secrets[1] != secretB || u.Secrets[2] != secretB {
		t.Errorf("%d secrets, want the file's two then the variable's", len(u.Secrets))
	}
	c := u.Config()
	if c.URL != u.URL || c.Mode != u.Mode || len(c.Secrets) != 3 {
		t.Errorf("Config() = %+v", c)
	}
	if u, err := webhook.ParseURL("http://h/events?mode=batch"); err != nil || u.URL != "http://h/events" || u.Mode != webhook.Batch {
		t.Errorf("mode=batch: %+v, %v", u, err)
	}
	if u, err := webhook.ParseURL("http://h/events?a=1;b=2&mode=message&c=%zz"); err != nil || u.URL != "http://h/events?a=1;b=2&c=%zz" || u.Mode != webhook.PerMessage {
		t.Errorf("an endpoint's query of its own syntax: %+v, %v", u, err)
	}
}

// TestParseURLSecretErrors: a secret in the URL is refused with what to do
// instead; a file or variable that holds no usable secret is refused; no
// error quotes a secret.
func TestParseURLSecretErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	short := write("short", secretA+"\nwhsec_UzNjcmV0\n") // "S3cret": 6 bytes
	notBase64 := write("bad", "whsec_S3cret!\n")
	empty := write("empty", "\n")
	t.Setenv("IDEM_TEST_WEBHOOK_EMPTY", "")
	for _, c := range []struct {
		url, want string
	}{
		{"https://hooks.example.com/idem?secret=whsec_S3cret", "never put in the URL"},
		{"https://hooks.example.com/idem?secret=whsec_S3cret", "secret_file=PATH"},
		{"https://hooks.example.com/idem?secret_file=" + short, "secret 2 of 2: the secret's key is 6 bytes"},
		{"https://hooks.example.com/idem?secret_file=" + notBase64, "not whsec_ followed by base64"},
		{"https://hooks.example.com/idem?secret_file=" + empty, "holds no secret"},
		{"https://hooks.example.com/idem?secret_file=", "secret_file is empty"},
		{"https://hooks.example.com/idem?secret_file=" + filepath.Join(dir, "missing"), "no such file"},
		{"https://hooks.example.com/idem?secret_env=IDEM_TEST_WEBHOOK_EMPTY", `the variable "IDEM_TEST_WEBHOOK_EMPTY" holds no secret`},
		{"https://hooks.example.com/idem?mode=stream", `mode="stream": want "batch" or "message"`},
	} {
		_, err := webhook.ParseURL(c.url)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseURL(%q): %v; want an error with %q", c.url, err, c.want)
		} else if strings.Contains(err.Error(), "S3cret") || strings.Contains(err.Error(), "UzNjcmV0") {
			t.Errorf("ParseURL(%q): %v shows the secret", c.url, err)
		}
	}
}

// The URL the idem command takes is the endpoint the publisher posts to.
func ExampleParseURL() {
	u, err := webhook.ParseURL("https://hooks.example.com/idem/events")
	if err != nil {
		log.Fatal(err)
	}
	pub := webhook.New(u.URL, nil) // a client with a 30s timeout
	defer pub.Close()
	fmt.Println(u.URL)
	// Output:
	// https://hooks.example.com/idem/events
}
