package webhook_test

import (
	"fmt"
	"log"
	"strings"
	"testing"

	"github.com/idem-go/idem/broker/webhook"
)

func TestParseURL(t *testing.T) {
	for _, raw := range []string{
		"http://127.0.0.1:8080/events",
		"https://hooks.example.com/idem?token=abc",
		"HTTPS://u:p@hooks.example.com",
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
