package webhook

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/idem-go/idem/broker"
)

// URLConfig is what a webhook URL says (ParseURL): the endpoint. Its query,
// if any, is the endpoint's: the publisher has no parameters of its own.
type URLConfig struct {
	// URL is the endpoint the publisher POSTs to: New(URL, client).
	URL string
}

// ParseURL checks a webhook URL, http://host/path or https://host/path:
// the scheme, and that it names a host. Errors never contain the password.
func ParseURL(rawURL string) (URLConfig, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL and its password
		}
		return URLConfig{}, fmt.Errorf("idem: webhook: URL %s: %w", broker.RedactURL(rawURL), err)
	}
	if s := strings.ToLower(u.Scheme); s != "http" && s != "https" {
		return URLConfig{}, fmt.Errorf("idem: webhook: URL %s: scheme %q: want http or https", broker.RedactURL(rawURL), u.Scheme)
	}
	if u.Host == "" {
		return URLConfig{}, fmt.Errorf("idem: webhook: URL %s: no host (want https://host/path)", broker.RedactURL(rawURL))
	}
	return URLConfig{URL: rawURL}, nil
}
