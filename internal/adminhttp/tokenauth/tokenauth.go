// Package tokenauth checks the bearer token of a request in constant
// time: the one check of the commands' addresses (package adminhttp) and
// of the dashboard. A leaf: the dashboard, a public package, imports it
// without the Go profiles that adminhttp serves.
package tokenauth

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

// Check reports whether r carries token, as "Authorization: Bearer TOKEN"
// or as the password of HTTP basic authentication (any user name, which
// browsers ask for), and who made it ("token", or "token:USER"), for audit
// lines.
func Check(r *http.Request, token string) (who string, ok bool) {
	if h := r.Header.Get("Authorization"); len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return "token", Equal(strings.TrimSpace(h[7:]), token)
	}
	if user, pass, found := r.BasicAuth(); found && Equal(pass, token) {
		return "token:" + user, true
	}
	return "", false
}

// Equal compares secrets in constant time (for their length).
func Equal(a, b string) bool {
	ha, hb := sha256.Sum256([]byte(a)), sha256.Sum256([]byte(b))
	return subtle.ConstantTimeCompare(ha[:], hb[:]) == 1
}
