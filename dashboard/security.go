package dashboard

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"

	"github.com/idem-go/idem/internal/adminhttp/tokenauth"
)

// csrfCookie holds the browser's random CSRF secret; each form carries an
// HMAC of it under the dashboard's key, checked on every POST.
const csrfCookie = "idem_dashboard_csrf"

// csrfField is the form field of the token.
const csrfField = "csrf"

// errCSRF is what a POST without the right CSRF token is refused with.
var errCSRF = errors.New("the form's CSRF token is missing or does not match this browser's cookie: reload the page and try again")

// authenticate checks the request's credentials when Config.Token or
// Config.BasicAuth is set, and returns who made it, for the audit lines.
func (d *Dashboard) authenticate(r *http.Request) (who string, ok bool) {
	if d.cfg.Token == "" && d.cfg.BasicAuth == nil {
		return "anonymous", true
	}
	if d.cfg.Token != "" {
		if who, ok := tokenauth.Check(r, d.cfg.Token); ok {
			return who, true
		}
	}
	if ba := d.cfg.BasicAuth; ba != nil {
		if user, pass, found := r.BasicAuth(); found {
			// Both compared, whatever the first gives: no timing hint.
			u, p := tokenauth.Equal(user, ba.User), tokenauth.Equal(pass, ba.Password)
			if u && p {
				return user, true
			}
		}
	}
	return "", false
}

// csrfToken returns the token the forms of this response must carry,
// setting the browser's CSRF cookie first when it has none.
func (d *Dashboard) csrfToken(w http.ResponseWriter, r *http.Request) string {
	secret := ""
	if c, err := r.Cookie(csrfCookie); err == nil && validSecret(c.Value) {
		secret = c.Value
	} else {
		b := make([]byte, 32)
		_, _ = rand.Read(b)
		secret = base64.RawURLEncoding.EncodeToString(b)
		http.SetCookie(w, &http.Cookie{
			Name: csrfCookie, Value: secret, Path: d.cfg.Path,
			HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode,
		})
	}
	return d.sign(secret)
}

func validSecret(s string) bool {
	b, err := base64.RawURLEncoding.DecodeString(s)
	return err == nil && len(b) == 32
}

func (d *Dashboard) sign(secret string) string {
	m := hmac.New(sha256.New, d.csrfKey)
	m.Write([]byte(secret))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// checkPost refuses a POST that comes from another origin (Sec-Fetch-Site,
// Origin), or whose form token does not match the browser's CSRF cookie.
func (d *Dashboard) checkPost(r *http.Request) error {
	if err := d.origin.Check(r); err != nil {
		return err
	}
	c, err := r.Cookie(csrfCookie)
	if err != nil || !validSecret(c.Value) {
		return errCSRF
	}
	got := r.PostFormValue(csrfField)
	if !hmac.Equal([]byte(got), []byte(d.sign(c.Value))) {
		return errCSRF
	}
	return nil
}
