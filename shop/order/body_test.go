package order

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// problemDetail returns the detail of a problem document.
func problemDetail(t *testing.T, body string) string {
	t.Helper()
	var p struct {
		Detail string `json:"detail"`
	}
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatalf("not a problem document: %v: %s", err, body)
	}
	return p.Detail
}

// refused sends body to POST /orders, checks that it is a 400 problem
// document, and returns its detail.
func refused(t *testing.T, url, name, body string) string {
	t.Helper()
	status, h, got := request{name, jsonType, nil, body, 400}.send(t, url)
	if status != http.StatusBadRequest {
		t.Errorf("%s: got %d, want 400: %s", name, status, got)
		return ""
	}
	checkProblem(t, name, status, h, got)
	return problemDetail(t, got)
}

// TestPlaceDuplicateMembers checks that a member sent twice, at any depth,
// is refused with its path, names compared after unescaping: the order
// would otherwise take the last copy, and the Idempotency-Key's
// fingerprint of a retry would depend on which copy the client put last.
func TestPlaceDuplicateMembers(t *testing.T) {
	t.Parallel()
	_, srv, db := setup(t, Config{})
	const line = `{"product_id":"p-1","quantity":"1"}`
	for _, c := range []struct{ name, body, path string }{
		{"customer twice", `{"customer_id":"c-1","customer_id":"c-2","lines":[` + line + `]}`, "customer_id"},
		{"customer twice, same value", `{"customer_id":"c-1","lines":[` + line + `],"customer_id":"c-1"}`, "customer_id"},
		{"customer twice, escaped", `{"customer_id":"c-1","customer\u005fid":"c-2","lines":[` + line + `]}`, "customer_id"},
		{"customer twice, all escaped", `{"\u0063ustomer_id":"c-1","lines":[` + line + `],"customer_i\u0064":"c-2"}`, "customer_id"},
		{"lines twice", `{"customer_id":"c-1","lines":[` + line + `],"lines":[]}`, "lines"},
		{"product in the second line", `{"customer_id":"c-1","lines":[` + line + `,{"product_id":"p-2","quantity":"1","product_id":"p-3"}]}`, "lines[1].product_id"},
		{"quantity in the first line, escaped", `{"customer_id":"c-1","lines":[{"product_id":"p-1","quantity":"1","quantit\u0079":"2"}]}`, "lines[0].quantity"},
		{"quantity in the third line, a number", `{"customer_id":"c-1","lines":[` + line + `,{"product_id":"p-2","quantity":"1"},{"quantity":"1","product_id":"p-3","quantity":1}]}`, "lines[2].quantity"},
	} {
		// The same body with a key: refused before the key is claimed.
		status, h, body := request{c.name, jsonType, []string{"dup-" + c.name}, c.body, 400}.send(t, srv.URL)
		if status != http.StatusBadRequest {
			t.Errorf("%s: got %d, want 400: %s", c.name, status, body)
			continue
		}
		checkProblem(t, c.name, status, h, body)
		if d := problemDetail(t, body); !strings.Contains(d, c.path+" appears twice") {
			t.Errorf("%s: detail %q does not name %s", c.name, d, c.path)
		}
	}
	if n := countOrders(t, db); n != 0 {
		t.Fatalf("%d orders from bodies with a member twice", n)
	}
	if n, err := db.Count(context.Background(), `SELECT count(*) FROM idempotent_request`); err != nil || n != 0 {
		t.Fatalf("%d keys claimed by refused requests (%v)", n, err)
	}
}

// TestPlaceTypeMismatches checks that a value of the wrong type is refused
// with a detail that gives its path, indexes included, what is expected and
// what came.
func TestPlaceTypeMismatches(t *testing.T) {
	t.Parallel()
	_, srv, db := setup(t, Config{})
	const line = `{"product_id":"p-1","quantity":"1"}`
	for _, c := range []struct{ name, body, want string }{
		{"quantity a number", `{"customer_id":"c-1","lines":[{"product_id":"p-1","quantity":2}]}`,
			`lines[0].quantity must be a string such as "2.000", not a number`},
		{"quantity a number in the second line", `{"customer_id":"c-1","lines":[` + line + `,{"product_id":"p-2","quantity":2.5}]}`,
			`lines[1].quantity must be a string such as "2.000", not a number`},
		{"quantity a huge number", `{"customer_id":"c-1","lines":[{"product_id":"p-1","quantity":1e400}]}`,
			`lines[0].quantity must be a string such as "2.000", not a number`},
		{"quantity null", `{"customer_id":"c-1","lines":[{"product_id":"p-1","quantity":null}]}`,
			`lines[0].quantity must be a string such as "2.000", not null`},
		{"quantity an array", `{"customer_id":"c-1","lines":[{"product_id":"p-1","quantity":["2"]}]}`,
			`lines[0].quantity must be a string such as "2.000", not an array`},
		{"product a boolean", `{"customer_id":"c-1","lines":[{"product_id":true,"quantity":"1"}]}`,
			`lines[0].product_id must be a string such as "p-1", not true`},
		{"customer an object", `{"customer_id":{"id":"c-1"},"lines":[` + line + `]}`,
			`customer_id must be a string such as "c-7", not an object`},
		{"customer a number", `{"customer_id":7,"lines":[` + line + `]}`,
			`customer_id must be a string such as "c-7", not a number`},
		{"customer null", `{"customer_id":null,"lines":[` + line + `]}`,
			`customer_id must be a string such as "c-7", not null`},
		{"lines a string", `{"customer_id":"c-1","lines":"p-1"}`,
			`lines must be an array of lines such as [{"product_id":"p-1","quantity":"2.000"}], not a string`},
		{"lines an object", `{"customer_id":"c-1","lines":` + line + `}`,
			`lines must be an array of lines such as [{"product_id":"p-1","quantity":"2.000"}], not an object`},
		{"lines null", `{"customer_id":"c-1","lines":null}`,
			`lines must be an array of lines such as [{"product_id":"p-1","quantity":"2.000"}], not null`},
		{"a line a number", `{"customer_id":"c-1","lines":[7]}`,
			`lines[0] must be an object such as {"product_id":"p-1","quantity":"2.000"}, not a number`},
		{"the third line a string", `{"customer_id":"c-1","lines":[` + line + `,{"product_id":"p-2","quantity":"1"},"p-3"]}`,
			`lines[2] must be an object such as {"product_id":"p-1","quantity":"2.000"}, not a string`},
		{"a line an array", `{"customer_id":"c-1","lines":[[` + line + `]]}`,
			`lines[0] must be an object such as {"product_id":"p-1","quantity":"2.000"}, not an array`},
		{"the body an array", `[` + body1 + `]`,
			`the body must be a JSON object such as {"customer_id":"c-7","lines":[{"product_id":"p-1","quantity":"2.000"}]}, not an array`},
		{"the body a string", `"order"`, `the body must be a JSON object such as `},
		{"the body null", `null`, `the body must be a JSON object such as `},
		{"the body a number", `42`, `the body must be a JSON object such as `},
	} {
		if d := refused(t, srv.URL, c.name, c.body); d != "" && !strings.Contains(d, c.want) {
			t.Errorf("%s: detail %q, want it to contain %q", c.name, d, c.want)
		}
	}
	if n := countOrders(t, db); n != 0 {
		t.Fatalf("%d orders from bodies of the wrong types", n)
	}
}

// TestPlaceDetailsSpeakJSON sends many bad bodies and checks that each 400
// says what to change in the body's own terms: its detail names no Go type
// and does not quote encoding/json ("json: cannot unmarshal ... into Go
// struct field ...").
func TestPlaceDetailsSpeakJSON(t *testing.T) {
	t.Parallel()
	_, srv, db := setup(t, Config{})
	for _, c := range []struct{ name, body, want string }{
		// Types.
		{"quantity a number", `{"customer_id":"c-1","lines":[{"product_id":"p-1","quantity":2}]}`, "lines[0].quantity"},
		{"quantity an object", `{"customer_id":"c-1","lines":[{"product_id":"p-1","quantity":{}}]}`, "lines[0].quantity"},
		{"customer an array", `{"customer_id":["c-1"],"lines":[]}`, "customer_id"},
		{"customer false", `{"customer_id":false,"lines":[]}`, "customer_id"},
		{"lines a number", `{"customer_id":"c-1","lines":1}`, "lines"},
		{"lines true", `{"customer_id":"c-1","lines":true}`, "lines"},
		{"a line null", `{"customer_id":"c-1","lines":[null]}`, "lines[0]"},
		{"a line a string", `{"customer_id":"c-1","lines":["p-1"]}`, "lines[0]"},
		{"body an array", `[]`, "the body"},
		{"body true", `true`, "the body"},
		{"body a negative number", `-1`, "the body"},
		// Members.
		{"unknown member", `{"customer_id":"c-1","lines":[],"note":"x"}`, `unknown member "note"`},
		{"unknown member of a line", `{"customer_id":"c-1","lines":[{"product_id":"p-1","qty":"1"}]}`, `unknown member "qty" in lines[0]`},
		{"member in another case", `{"Customer_ID":"c-1","lines":[]}`, "case-sensitive"},
		{"member of a line in another case", `{"customer_id":"c-1","lines":[{"PRODUCT_ID":"p-1","quantity":"1"}]}`, "case-sensitive"},
		{"a member twice", `{"customer_id":"c-1","customer_id":"c-2","lines":[]}`, "customer_id appears twice"},
		{"a long unknown member", `{"` + strings.Repeat("x", 500) + `":1}`, "unknown member"},
		// Syntax.
		{"not JSON", `customer_id=c-1`, "not valid JSON"},
		{"single quotes", `{'customer_id':'c-1'}`, "not valid JSON"},
		{"missing colon", `{"customer_id" "c-1"}`, "not valid JSON"},
		{"trailing comma", `{"customer_id":"c-1",}`, "not valid JSON"},
		{"comment", `{"customer_id":"c-1" /* c */}`, "not valid JSON"},
		{"truncated", `{"customer_id":"c-1","lines":[{"product_id"`, "ends before"},
		{"unclosed string", `{"customer_id":"c-1`, "ends before"},
		{"bad escape", `{"customer_id":"c-\x"}`, "not valid JSON"},
		{"control character in a string", "{\"customer_id\":\"c\x01\"}", "not valid JSON"},
		{"NaN", `{"customer_id":"c-1","lines":[{"product_id":"p-1","quantity":NaN}]}`, "not valid JSON"},
		{"data after", body1 + `{}`, "data after"},
		{"garbage after", body1 + `x`, "data after"},
		// Values.
		{"quantity not a decimal", `{"customer_id":"c-1","lines":[{"product_id":"p-1","quantity":"two"}]}`, "lines[0]"},
		{"quantity zero", `{"customer_id":"c-1","lines":[{"product_id":"p-1","quantity":"0"}]}`, "positive"},
		{"no lines", `{"customer_id":"c-1","lines":[]}`, "lines"},
		{"empty object", `{}`, "customer_id"},
		{"product twice", `{"customer_id":"c-1","lines":[{"product_id":"p-1","quantity":"1"},{"product_id":"p-1","quantity":"1"}]}`, "twice"},
		{"empty", ``, "empty"},
	} {
		d := refused(t, srv.URL, c.name, c.body)
		if d == "" {
			continue
		}
		if strings.Contains(d, "json:") || strings.Contains(d, "Go ") || strings.Contains(d, "struct") {
			t.Errorf("%s: detail in Go's terms: %q", c.name, d)
		}
		if !strings.Contains(d, c.want) {
			t.Errorf("%s: detail %q, want it to contain %q", c.name, d, c.want)
		}
	}
	if n := countOrders(t, db); n != 0 {
		t.Fatalf("%d orders from bad bodies", n)
	}
}

// FuzzParsePlace checks that parsePlace never panics, that its errors
// never speak Go, and that what it accepts is a valid order in JSON with
// every member once.
func FuzzParsePlace(f *testing.F) {
	for _, s := range []string{body1, body2, ``, `{}`, `[]`, `null`,
		`{"customer_id":"c-1","customer_id":"c-2","lines":[{"product_id":"p-1","quantity":"1"}]}`,
		`{"customer\u005fid":"c-1","lines":[{"product_id":"p-1","quantity":2}]}`,
		`{"customer_id":"c-1","lines":[{"product_id":"p-1","quantity":"1"},{"product_id":"p-2","quantity":"1","product_id":"p-3"}]}`,
		`{"Customer_ID":"c-1","lines":[{"product_id":"p-1","quantity":"1"}]}`,
		`{"customer_id":"c-1","lines":[{"product_id":"p-1","quantity":"1"}]} x`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := parsePlace(body)
		if err != nil {
			if d := err.Error(); strings.Contains(d, "json:") || strings.Contains(d, "Go ") {
				t.Fatalf("detail in Go's terms: %q", d)
			}
			return
		}
		if !json.Valid(body) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
		if len(req.Lines) == 0 || len(req.Lines) > MaxLines || req.CustomerID == "" {
			t.Fatalf("accepted %q as %+v", body, req)
		}
		// Every member once and by its name: an accepted order has all
		// four members, customer_id and lines, product_id and quantity in
		// each line, so a body with one more is a duplicate let through.
		if n, want := countMembers(t, body), 2+2*len(req.Lines); n != want {
			t.Fatalf("accepted %q with %d members, want %d", body, n, want)
		}
	})
}

// countMembers returns the number of object members in body, valid JSON,
// at every depth, duplicates included.
func countMembers(t *testing.T, body []byte) int {
	type level struct{ object, wantName bool }
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var stack []level
	n := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return n
		}
		if err != nil {
			t.Fatalf("%q: %v", body, err)
		}
		top := len(stack) - 1
		if _, name := tok.(string); name && top >= 0 && stack[top].wantName {
			n++
			stack[top].wantName = false
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, level{object: true, wantName: true})
			continue
		case json.Delim('['):
			stack = append(stack, level{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:top]
			top--
		}
		if top >= 0 && stack[top].object { // a value ended: a name or '}' follows
			stack[top].wantName = true
		}
	}
}
