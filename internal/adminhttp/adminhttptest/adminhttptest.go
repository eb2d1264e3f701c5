// Package adminhttptest checks what an address of a command answers, for
// the process tests of idem and the shop: every path with and without the
// token, and no secret in any answer or output.
package adminhttptest

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// client fetches without keeping connections (goleak), and follows no
// redirect: a 3xx is an answer to check.
var client = &http.Client{
	Timeout:       30 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// Get fetches base+path, with "Authorization: Bearer token" when token is
// set, and returns the status and the whole answer, headers included.
func Get(t testing.TB, base, path, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Close = true
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	head, _ := httputil.DumpResponse(resp, false)
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode, string(head) + string(body)
}

// Path is a path of an address and what it answers.
type Path struct {
	// Path is the path, with its query.
	Path string
	// Status is the status wanted with the token.
	Status int
	// Open, when set, is the whole body answered without the token too
	// (/healthz: "ok\n"); empty: 401 without the token.
	Open []string
}

// Check fetches every path with the token and without it, and fails the
// test when an answer without the token is not 401 (or, for an open path,
// not one of its Open bodies), when the status with the token is not the
// one wanted, or when any answer holds one of secrets. It returns the
// bodies answered with the token, by path.
func Check(t testing.TB, base, token string, paths []Path, secrets ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range paths {
		code, answer := Get(t, base, p.Path, "")
		NoSecret(t, "GET "+p.Path+" without the token", answer, secrets...)
		_, body, _ := strings.Cut(answer, "\r\n\r\n")
		switch {
		case p.Open == nil && code != http.StatusUnauthorized:
			t.Errorf("GET %s without the token: %d, want 401\n%.300s", p.Path, code, answer)
		case p.Open != nil && !slices.Contains(p.Open, body):
			t.Errorf("GET %s without the token: %d %q, want one of %q", p.Path, code, body, p.Open)
		}
		code, answer = Get(t, base, p.Path, "not-"+token)
		NoSecret(t, "GET "+p.Path+" with a wrong token", answer, secrets...)
		if p.Open == nil && code != http.StatusUnauthorized {
			t.Errorf("GET %s with a wrong token: %d, want 401", p.Path, code)
		}
		code, answer = Get(t, base, p.Path, token)
		NoSecret(t, "GET "+p.Path, answer, secrets...)
		if code != p.Status {
			t.Errorf("GET %s with the token: %d, want %d\n%.500s", p.Path, code, p.Status, answer)
		}
		_, out[p.Path], _ = strings.Cut(answer, "\r\n\r\n")
	}
	return out
}

// PprofPaths returns the paths of what the profile index at base links
// (GET /debug/pprof/ with the token): each named profile with ?debug=1,
// the CPU profile and the trace over a second; the index itself and
// /debug/pprof/cmdline, which must be 404, with them.
func PprofPaths(t testing.TB, base, token string) []Path {
	t.Helper()
	code, index := Get(t, base, "/debug/pprof/", token)
	if code != http.StatusOK {
		t.Fatalf("GET /debug/pprof/: %d\n%s", code, index)
	}
	paths := []Path{{Path: "/debug/pprof/", Status: http.StatusOK}, {Path: "/debug/pprof/cmdline", Status: http.StatusNotFound}}
	for _, m := range regexp.MustCompile(`href=['"]?([^'" >]+)`).FindAllStringSubmatch(index, -1) {
		name, _, _ := strings.Cut(m[1], "?")
		switch name {
		case "profile", "trace":
			paths = append(paths, Path{Path: "/debug/pprof/" + name + "?seconds=1", Status: http.StatusOK})
		default:
			paths = append(paths, Path{Path: "/debug/pprof/" + name + "?debug=1", Status: http.StatusOK})
		}
	}
	if len(paths) < 8 {
		t.Fatalf("the profile index links %d profiles:\n%s", len(paths)-2, index)
	}
	return paths
}

// NoSecret fails the test when text holds one of secrets, naming what and
// showing where, with every secret masked.
func NoSecret(t testing.TB, what, text string, secrets ...string) {
	t.Helper()
	for i, s := range secrets {
		if s == "" {
			t.Fatalf("NoSecret: secret %d is empty", i)
		}
		if at := strings.Index(text, s); at >= 0 {
			excerpt := text[max(0, at-120):min(len(text), at+len(s)+40)]
			for j, other := range secrets {
				excerpt = strings.ReplaceAll(excerpt, other, fmt.Sprintf("<SECRET %d>", j))
			}
			t.Errorf("%s holds secret %d: ...%s...", what, i, excerpt)
		}
	}
}
