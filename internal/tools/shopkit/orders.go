package shopkit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// PlaceResult is the answer to POST /orders.
type PlaceResult struct {
	// Status is the HTTP status.
	Status int
	// ID is the order's id, when the body has one.
	ID string
	// Replayed is set when the answer is a replay of an earlier request
	// with the same Idempotency-Key (Idempotent-Replayed: true).
	Replayed bool
	// Body is the response body.
	Body string
}

var httpClient = &http.Client{Timeout: 30 * time.Second}

// PlaceOrder posts an order of customer with lines products to the order
// API at addr (host:port), with the Idempotency-Key key when not empty.
func PlaceOrder(ctx context.Context, addr, key, customer string, lines int) (PlaceResult, error) {
	return PlaceOrderWith(ctx, httpClient, addr, key, customer, lines)
}

// PlaceOrderWith is PlaceOrder through client: a load generator sizes its
// own connection pool for its concurrency.
func PlaceOrderWith(ctx context.Context, client *http.Client, addr, key, customer string, lines int) (PlaceResult, error) {
	type line struct {
		ProductID string `json:"product_id"`
		Quantity  string `json:"quantity"`
	}
	body := struct {
		CustomerID string `json:"customer_id"`
		Lines      []line `json:"lines"`
	}{CustomerID: customer}
	for i := range lines {
		body.Lines = append(body.Lines, line{ProductID: fmt.Sprintf("p-%d", i+1), Quantity: fmt.Sprintf("%d.000", i+1)})
	}
	raw, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/orders", bytes.NewReader(raw))
	if err != nil {
		return PlaceResult{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return PlaceResult{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	res := PlaceResult{Status: resp.StatusCode, Body: string(b), Replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
	var o struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(b, &o) == nil {
		res.ID = o.ID
	}
	return res, nil
}

// PlaceOK places an order and fails unless it is created.
func PlaceOK(ctx context.Context, addr, customer string, lines int) (string, error) {
	r, err := PlaceOrder(ctx, addr, "", customer, lines)
	if err != nil {
		return "", err
	}
	if r.Status != http.StatusCreated {
		return "", fmt.Errorf("POST /orders: %d %s", r.Status, r.Body)
	}
	return r.ID, nil
}

// GetJSON gets url into v; any status but 200 is an error.
func GetJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// PostJSON posts v to url as JSON; any status but 200 is an error.
func PostJSON(ctx context.Context, url string, v any) error {
	raw, _ := json.Marshal(v)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(raw))
	if err != nil {
		return err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return &StatusError{URL: url, Code: resp.StatusCode, Status: resp.Status}
	}
	return nil
}

// StatusError is PostJSON's error for an answer other than 200.
type StatusError struct {
	URL    string
	Code   int    // the HTTP status code
	Status string // the status line, "404 Not Found"
}

func (e *StatusError) Error() string { return "POST " + e.URL + ": " + e.Status }

// Refused reports whether err is an answer that refuses the request
// itself (a 4xx other than 408, 409 and 429), as opposed to a server away,
// busy or failing, whose answer may change if the request is sent again.
func Refused(err error) bool {
	var se *StatusError
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooManyRequests:
		return false
	}
	return se.Code >= 400 && se.Code < 500
}
