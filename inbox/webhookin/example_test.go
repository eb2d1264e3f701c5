package webhookin_test

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver/sqlite"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/inbox/webhookin"
	"github.com/idem-go/idem/migrate"
)

// A shop receives Stripe's webhooks: an order is marked paid once, however
// often Stripe delivers the event, and a request Stripe did not sign is
// refused.
func Example() {
	dir, _ := os.MkdirTemp("", "webhookin-example")
	defer os.RemoveAll(dir)
	db, _ := sqlite.Open(filepath.Join(dir, "shop.db"))
	defer db.Close()
	drv := sqlite.New(db)
	ctx := context.Background()
	if _, err := migrate.New(drv).Up(ctx); err != nil { // processed_event, failed_message...
		fmt.Println(err)
		return
	}
	_, _ = db.Exec(`CREATE TABLE paid_order (order_id TEXT PRIMARY KEY)`)

	quiet := slog.New(slog.DiscardHandler)
	payments, err := inbox.New(drv, inbox.Config{Name: "stripe", Logger: quiet})
	if err != nil {
		fmt.Println(err)
		return
	}
	payments.Handle("payment_intent.succeeded", func(ctx context.Context, tx *sql.Tx, ev idem.Event) error {
		var pi struct {
			Data struct {
				Object struct {
					Metadata struct {
						OrderID string `json:"order_id"`
					} `json:"metadata"`
				} `json:"object"`
			} `json:"data"`
		}
		if err := json.Unmarshal(ev.Payload, &pi); err != nil || pi.Data.Object.Metadata.OrderID == "" {
			return idem.Permanent(fmt.Errorf("no order in the payment: %v", err)) // parked, answered 202
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO paid_order (order_id) VALUES (?)`, pi.Data.Object.Metadata.OrderID)
		return err
	})
	secret := "whsec_example" // the endpoint's signing secret: read it from a file or a variable
	h, err := webhookin.New(payments, webhookin.Config{
		Provider: webhookin.Stripe{Secrets: []string{secret}},
		Logger:   quiet,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	event := `{"id":"evt_3MtwBwLkdIwHu7ix28a3tqPa","object":"event","type":"payment_intent.succeeded",` +
		`"data":{"object":{"id":"pi_1","metadata":{"order_id":"42"}}}}`
	send := func(key string) {
		// What Stripe sends: Stripe-Signature t=...,v1=HMAC-SHA256("<t>.<body>").
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		mac := hmac.New(sha256.New, []byte(key))
		mac.Write([]byte(ts + "." + event))
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(event))
		req.Header.Set("Stripe-Signature", "t="+ts+",v1="+hex.EncodeToString(mac.Sum(nil)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer resp.Body.Close()
		var answer struct{ Outcome string }
		_ = json.NewDecoder(resp.Body).Decode(&answer)
		fmt.Println(resp.StatusCode, cmp.Or(answer.Outcome, "refused"))
		_, _ = io.Copy(io.Discard, resp.Body)
	}
	send(secret)
	send(secret) // Stripe did not see the answer and delivers again
	send("whsec_forged")

	var n int
	_ = db.QueryRow(`SELECT COUNT(*) FROM paid_order WHERE order_id = '42'`).Scan(&n)
	fmt.Println("orders paid:", n)
	// Output:
	// 200 applied
	// 200 duplicate
	// 401 refused
	// orders paid: 1
}
