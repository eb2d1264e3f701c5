package webhook

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/internal/stdwebhook"
)

// URLConfig is what a webhook URL says (ParseURL): the endpoint, and idem's
// own parameters. Config turns it into a publisher's configuration.
type URLConfig struct {
	// URL is the endpoint the publisher POSTs to: the URL without idem's
	// parameters, the endpoint's own kept as they were.
	URL string
	// Mode is the parameter mode, batch or message; empty when absent
	// (Batch).
	Mode Mode
	// Secrets are the signing secrets read from the files of the
	// parameters secret_file and the variables of secret_env, in that
	// order. Never log a URLConfig.
	Secrets []string
}

// Config returns the configuration of a publisher to the URL's endpoint,
// in its mode, signing with its secrets.
func (c URLConfig) Config() Config {
	return Config{URL: c.URL, Mode: c.Mode, Secrets: c.Secrets}
}

// urlParams are the parameters ParseURL takes out of the URL: the others
// are the endpoint's.
var urlParams = map[string]bool{"mode": true, "secret_file": true, "secret_env": true}

// ParseURL checks a webhook URL, http://host/path or https://host/path
// (the scheme, and that it names a host), and reads idem's parameters:
//
//   - mode=batch|message: one request per Publish call (the default) or one
//     per message (PerMessage);
//   - secret_file=PATH: sign each request with the Standard Webhooks
//     secrets the file holds ("whsec_<base64>", separated by spaces or
//     lines; two while a receiver moves from one to the next);
//   - secret_env=NAME: the same, from the variable NAME.
//
// Both may be repeated; the secrets of every file and variable sign each
// request. The secret itself is never a parameter: a URL with secret= is
// refused, for URLs are printed (masked, but still) where a file or a
// variable is not. The other parameters are the endpoint's, sent as they
// are. Errors never contain the password or a secret.
func ParseURL(rawURL string) (URLConfig, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL and its password
		}
		return URLConfig{}, fmt.Errorf("idem: webhook: URL %s: %w", broker.RedactURL(rawURL), err)
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("idem: webhook: URL %s: %s", broker.RedactURL(rawURL), fmt.Sprintf(format, args...))
	}
	if s := strings.ToLower(u.Scheme); s != "http" && s != "https" {
		return URLConfig{}, bad("scheme %q: want http or https", u.Scheme)
	}
	if u.Host == "" {
		return URLConfig{}, bad("no host (want https://host/path)")
	}
	// The query is the endpoint's, whatever its syntax: what it has of
	// idem's parameters is read, the rest kept as it is.
	q, _ := url.ParseQuery(u.RawQuery)
	if q.Has("secret") {
		return URLConfig{}, bad("parameter secret: a signing secret is never put in the URL; write it in a file and give secret_file=PATH, or in a variable and give secret_env=NAME")
	}
	c := URLConfig{URL: rawURL, Mode: Mode(q.Get("mode"))}
	switch c.Mode {
	case "", Batch, PerMessage:
	default:
		return URLConfig{}, bad("mode=%q: want %q or %q", c.Mode, Batch, PerMessage)
	}
	for _, path := range q["secret_file"] {
		if path == "" {
			return URLConfig{}, bad("secret_file is empty: want the path of a file holding the secret")
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return URLConfig{}, bad("secret_file: %v", err) // the path, never the content
		}
		if err := c.addSecrets("secret_file "+path, string(b)); err != nil {
			return URLConfig{}, bad("%v", err)
		}
	}
	for _, name := range q["secret_env"] {
		if err := c.addSecrets(fmt.Sprintf("secret_env: the variable %q", name), os.Getenv(name)); err != nil {
			return URLConfig{}, bad("%v", err)
		}
	}
	if q.Has("mode") || q.Has("secret_file") || q.Has("secret_env") {
		c.URL = withoutParams(rawURL, u.RawQuery)
	}
	return c, nil
}

// addSecrets adds the secrets of text, separated by white space, checked;
// from names where they come from, for errors, which never quote them.
func (c *URLConfig) addSecrets(from, text string) error {
	secrets := strings.Fields(text)
	if len(secrets) == 0 {
		return fmt.Errorf("%s holds no secret (want whsec_ followed by the key in base64)", from)
	}
	for i, s := range secrets {
		if _, err := stdwebhook.ParseSigningSecret(s); err != nil {
			return fmt.Errorf("%s, secret %d of %d: %w", from, i+1, len(secrets), err)
		}
	}
	c.Secrets = append(c.Secrets, secrets...)
	return nil
}

// withoutParams returns rawURL without idem's parameters (urlParams) in
// its query rawQuery, the others kept in order and as they were written.
func withoutParams(rawURL, rawQuery string) string {
	var kept []string
	for _, kv := range strings.Split(rawQuery, "&") {
		k, _, _ := strings.Cut(kv, "=")
		if name, err := url.QueryUnescape(k); err == nil && urlParams[name] {
			continue
		}
		kept = append(kept, kv)
	}
	base, frag, hasFrag := strings.Cut(rawURL, "#")
	base, _, _ = strings.Cut(base, "?")
	if len(kept) > 0 {
		base += "?" + strings.Join(kept, "&")
	}
	if hasFrag {
		base += "#" + frag
	}
	return base
}
