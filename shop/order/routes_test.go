package order

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestRoutesAnswerProblems checks that a request the API has no route for
// is a problem document like every other error: 404 for an unknown path,
// 405 with Allow for another method on a known one.
func TestRoutesAnswerProblems(t *testing.T) {
	t.Parallel()
	_, srv, db := setup(t, Config{})
	o := placeJSON(t, srv.URL)
	for _, c := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{http.MethodGet, "/orders", 405, "POST"},
		{http.MethodPut, "/orders", 405, "POST"},
		{http.MethodDelete, "/orders", 405, "POST"},
		{http.MethodHead, "/orders", 405, "POST"},
		{http.MethodDelete, "/orders/" + o.ID, 405, "GET, HEAD"},
		{http.MethodPost, "/orders/" + o.ID, 405, "GET, HEAD"},
		{http.MethodPatch, "/orders/" + o.ID, 405, "GET, HEAD"},
		{http.MethodGet, "/orders/" + o.ID + "/cancel", 405, "POST"},
		{http.MethodDelete, "/orders/" + o.ID + "/cancel", 405, "POST"},
		{http.MethodOptions, "/orders", 405, "POST"},
		{http.MethodGet, "/", 404, ""},
		{http.MethodPost, "/", 404, ""},
		{http.MethodGet, "/nope", 404, ""},
		{http.MethodGet, "/orders/", 404, ""},
		{http.MethodGet, "/orders/" + o.ID + "/lines", 404, ""},
		{http.MethodPost, "/orders/" + o.ID + "/cancel/now", 404, ""},
		{http.MethodGet, "/order", 404, ""},
		{http.MethodGet, "/ORDERS", 404, ""},
		{http.MethodGet, "/carrier/stats", 404, ""},
		{http.MethodGet, "/orders/" + "no-such-order", 404, ""},
		{http.MethodPost, "/orders/" + "no-such-order" + "/cancel", 404, ""},
	} {
		name := c.method + " " + c.path
		req, err := http.NewRequest(c.method, srv.URL+c.path, strings.NewReader(body1))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("%s: got %d, want %d: %s", name, resp.StatusCode, c.status, b)
			continue
		}
		if got := resp.Header.Get("Allow"); got != c.allow {
			t.Errorf("%s: Allow %q, want %q", name, got, c.allow)
		}
		if c.method == http.MethodHead { // no body to read
			if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("%s: Content-Type %q, want application/problem+json", name, ct)
			}
			continue
		}
		checkProblem(t, name, c.status, resp.Header, string(b))
	}
	if n := countOrders(t, db); n != 1 {
		t.Fatalf("%d orders, want 1: a refused request made an order", n)
	}
	// The routes still answer their own methods.
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, "/orders/" + o.ID},
		{http.MethodHead, "/orders/" + o.ID},
	} {
		req, _ := http.NewRequest(c.method, srv.URL+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s %s: got %d, want 200", c.method, c.path, resp.StatusCode)
		}
	}
}

// TestPlaceLocation checks that 201 Created gives the order's path in
// Location, the path GET answers on, and that a replay of the stored
// response keeps it.
func TestPlaceLocation(t *testing.T) {
	t.Parallel()
	_, srv, _ := setup(t, Config{})
	for _, c := range []struct {
		name, key string
		replays   int
	}{
		{"without a key", "", 0},
		{"with a key, then replayed", "key-location", 2},
	} {
		var key []string
		if c.key != "" {
			key = []string{c.key}
		}
		var id string
		for i := 0; i <= c.replays; i++ {
			status, h, body := request{c.name, jsonType, key, body1, 201}.send(t, srv.URL)
			if status != http.StatusCreated {
				t.Fatalf("%s, request %d: got %d, want 201: %s", c.name, i+1, status, body)
			}
			replayed := h.Get("Idempotent-Replayed") == "true"
			if replayed != (i > 0) {
				t.Fatalf("%s, request %d: Idempotent-Replayed %q", c.name, i+1, h.Get("Idempotent-Replayed"))
			}
			o := orderOf(t, body)
			if i == 0 {
				id = o.ID
			}
			if o.ID != id {
				t.Fatalf("%s, request %d: order %s, want the first one, %s", c.name, i+1, o.ID, id)
			}
			if got, want := h.Get("Location"), "/orders/"+id; got != want {
				t.Fatalf("%s, request %d (replayed %v): Location %q, want %q", c.name, i+1, replayed, got, want)
			}
		}
		resp, err := http.Get(srv.URL + "/orders/" + id)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || orderOf(t, string(b)).ID != id {
			t.Fatalf("%s: GET the Location: %d %s", c.name, resp.StatusCode, b)
		}
	}
}

func orderOf(t *testing.T, body string) Order {
	t.Helper()
	var o Order
	if err := json.Unmarshal([]byte(body), &o); err != nil || o.ID == "" {
		t.Fatalf("not an order (%v): %s", err, body)
	}
	return o
}
