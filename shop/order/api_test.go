package order

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// request is one POST /orders with its headers as sent: a nil value
// leaves the header out, a list sends it once per element.
type request struct {
	name        string
	contentType []string
	key         []string
	body        string
	want        int
}

func (rq request) send(t *testing.T, url string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/orders", strings.NewReader(rq.body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header["Content-Type"] = rq.contentType
	req.Header["Idempotency-Key"] = rq.key
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", rq.name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

var jsonType = []string{"application/json"}

// checkProblem checks that an error answer is a problem document with its
// status.
func checkProblem(t *testing.T, name string, status int, h http.Header, body string) {
	t.Helper()
	var p struct {
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}
	if h.Get("Content-Type") != "application/problem+json" || json.Unmarshal([]byte(body), &p) != nil || p.Status != status || p.Detail == "" {
		t.Errorf("%s: answer %d is not a problem document with its status and a detail: %s %s", name, status, h.Get("Content-Type"), body)
	}
}

// TestPlaceInput checks the exact status of each kind of bad input to
// POST /orders, and that none of them makes an order.
func TestPlaceInput(t *testing.T) {
	t.Parallel()
	_, srv, db := setupSQLite(t, Config{})
	padded := body1 + strings.Repeat(" ", MaxBodyBytes-len(body1)) // exactly the limit
	created := 0
	for _, rq := range []request{
		// Content-Type.
		{"json", jsonType, nil, body1, 201},
		{"json with charset", []string{"application/json; charset=utf-8"}, nil, body1, 201},
		{"json, upper case", []string{"Application/JSON; Charset=UTF-8"}, nil, body1, 201},
		{"a +json type", []string{"application/vnd.shop.order+json"}, nil, body1, 201},
		{"no Content-Type", nil, nil, body1, 415},
		{"form, as curl -d sends", []string{"application/x-www-form-urlencoded"}, nil, body1, 415},
		{"text/plain", []string{"text/plain"}, nil, body1, 415},
		{"text/json", []string{"text/json"}, nil, body1, 415},
		{"application/jsonx", []string{"application/jsonx"}, nil, body1, 415},
		{"json-seq", []string{"application/json-seq"}, nil, body1, 415},
		{"latin-1", []string{"application/json; charset=iso-8859-1"}, nil, body1, 415},
		{"unparsable", []string{"application/json; charset"}, nil, body1, 415},
		// Size.
		{"one byte too many", jsonType, nil, padded + " ", 413},
		{"exactly the limit", jsonType, nil, padded, 201},
		// After the JSON value.
		{"two objects", jsonType, nil, body1 + body1, 400},
		{"two objects on two lines", jsonType, nil, body1 + "\n" + body2, 400},
		{"trailing garbage", jsonType, nil, body1 + "x", 400},
		{"trailing bracket", jsonType, nil, body1 + "]", 400},
		{"trailing whitespace", jsonType, nil, body1 + " \r\n\t\n", 201},
		{"empty body", jsonType, nil, "", 400},
		{"whitespace only", jsonType, nil, "  \n", 400},
		{"truncated", jsonType, nil, body1[:20], 400},
		// Idempotency-Key.
		{"empty key", jsonType, []string{""}, body1, 400},
		{"blank key", jsonType, []string{"   "}, body1, 400},
		{"two keys", jsonType, []string{"k-1", "k-2"}, body1, 400},
		{"key with a tab", jsonType, []string{"a\tb"}, body1, 400},
		{"key not UTF-8", jsonType, []string{"k-\xff\xfe"}, body1, 400},
		{"key too long", jsonType, []string{strings.Repeat("k", MaxKeyLength+1)}, body1, 400},
		{"longest key", jsonType, []string{strings.Repeat("k", MaxKeyLength)}, body1, 201},
		{"key in UTF-8", jsonType, []string{"clé-été-☃"}, body1, 201},
	} {
		status, h, body := rq.send(t, srv.URL)
		if status != rq.want {
			t.Errorf("%s: got %d, want %d: %s", rq.name, status, rq.want, body)
			continue
		}
		if status == http.StatusCreated {
			created++
		} else {
			checkProblem(t, rq.name, status, h, body)
		}
		if status == http.StatusUnsupportedMediaType && h.Get("Accept-Post") != "application/json" {
			t.Errorf("%s: 415 without Accept-Post", rq.name)
		}
	}
	if n := countOrders(t, db); n != int64(created) {
		t.Fatalf("%d orders, want %d: a refused request made an order", n, created)
	}
}

// TestPlaceKeyControlCharacters sends keys with control characters. The
// HTTP server refuses most of them itself with 400; the handler refuses
// whatever reaches it (a tab, or the C1 controls of UTF-8) with 400 too,
// so no key ends in the database as a 500 or is dropped.
func TestPlaceKeyControlCharacters(t *testing.T) {
	t.Parallel()
	s, srv, db := setupSQLite(t, Config{})
	for _, key := range []string{"a\x00b", "a\x01b", "a\x1fb", "a\x7fb", "a\tb"} {
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST /orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nIdempotency-Key: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
			key, len(body1), body1)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		conn.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("key %q over HTTP: got %d, want 400", key, resp.StatusCode)
		}
	}
	h := s.Handler()
	for _, key := range []string{"a\x00b", "a\x1bb", "a\x7fb", "a\u0085b", "a\u009fb", "\x00"} {
		req := httptest.NewRequest(http.MethodPost, "/orders", bytes.NewReader([]byte(body1)))
		req.Header.Set("Content-Type", "application/json")
		req.Header["Idempotency-Key"] = []string{key}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusBadRequest {
			t.Errorf("key %q to the handler: got %d, want 400: %s", key, rec.Code, rec.Body)
		}
		checkProblem(t, fmt.Sprintf("key %q", key), rec.Code, rec.Header(), rec.Body.String())
	}
	if n := countOrders(t, db); n != 0 {
		t.Fatalf("%d orders from refused requests", n)
	}
}

// TestPlaceKeyFingerprintIsTheBytes checks that the same order written with
// other bytes is another request for its key: 422, not a replay.
func TestPlaceKeyFingerprintIsTheBytes(t *testing.T) {
	t.Parallel()
	_, srv, db := setupSQLite(t, Config{})
	if r := post(t, srv.URL, "key-bytes", body1); r.status != http.StatusCreated {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	if r := post(t, srv.URL, "key-bytes", body1); r.status != http.StatusCreated || !r.replayed {
		t.Fatalf("same bytes: %d replayed=%v, want a replayed 201", r.status, r.replayed)
	}
	if r := post(t, srv.URL, "key-bytes", body1+"\n"); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("same order, other bytes: %d %s, want 422", r.status, r.body)
	}
	if n := countOrders(t, db); n != 1 {
		t.Fatalf("%d orders, want 1", n)
	}
}
