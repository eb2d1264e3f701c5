package tokenauth_test

import (
	"net/http"
	"testing"

	"github.com/idem-go/idem/internal/adminhttp/tokenauth"
)

// The token passes as a bearer token or as a basic password, and nothing
// else does.
func TestCheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, header string
		user, pass   string
		who          string
		ok           bool
	}{
		{name: "bearer", header: "Bearer s3cret", who: "token", ok: true},
		{name: "bearer, any case", header: "bearer  s3cret ", who: "token", ok: true},
		{name: "wrong bearer", header: "Bearer s3cre", who: "token"},
		{name: "basic", user: "ops", pass: "s3cret", who: "token:ops", ok: true},
		{name: "wrong basic", user: "ops", pass: "nope"},
		{name: "none"},
	} {
		r, _ := http.NewRequest(http.MethodGet, "http://x/", nil)
		if tc.header != "" {
			r.Header.Set("Authorization", tc.header)
		}
		if tc.user != "" {
			r.SetBasicAuth(tc.user, tc.pass)
		}
		if who, ok := tokenauth.Check(r, "s3cret"); ok != tc.ok || who != tc.who {
			t.Errorf("%s: Check = %q, %v; want %q, %v", tc.name, who, ok, tc.who, tc.ok)
		}
	}
}
