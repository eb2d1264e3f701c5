// Package carrier is a fake carrier and mail service for the shop, and its
// client. Like a real carrier API, it honours idempotency keys: a request
// repeated with the same Idempotency-Key creates nothing new and gets the
// first answer. It can also be told to process the next requests and then
// drop their answers (close the connection without responding), the case
// where a client does not know whether its request took effect.
//
// Endpoints, under the prefix /carrier:
//
//	POST /carrier/pickups              {"reference": "<order id>"}, header Idempotency-Key
//	GET  /carrier/pickups?reference=<order id>
//	POST /carrier/pickups/{id}/cancel  header Idempotency-Key
//	POST /carrier/emails            {"to": "...", "subject": "..."}, header Idempotency-Key
//	GET  /carrier/emails?key=<idempotency key>
//	POST /carrier/control           {"drop_responses": N}
//	GET  /carrier/stats
package carrier

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem/idempotency"
	"github.com/idem-go/idem/shop/store"
)

var migrations = store.Migrations{
	store.Postgres: {`
CREATE TABLE pickup (
    id         varchar(36)  PRIMARY KEY,
    idem_key   varchar(255) NOT NULL UNIQUE,
    reference  varchar(100) NOT NULL,
    created_at timestamptz  NOT NULL
);
CREATE INDEX pickup_reference_idx ON pickup (reference);
CREATE TABLE email (
    id         varchar(36)  PRIMARY KEY,
    idem_key   varchar(255) NOT NULL UNIQUE,
    recipient  varchar(255) NOT NULL,
    subject    varchar(255) NOT NULL,
    created_at timestamptz  NOT NULL
);
`, `
ALTER TABLE pickup ADD COLUMN cancelled_at timestamptz;
ALTER TABLE pickup ADD COLUMN cancel_key varchar(255);
`},
	store.MySQL: {`
CREATE TABLE pickup (
    id         VARCHAR(36)  NOT NULL PRIMARY KEY,
    idem_key   VARCHAR(255) NOT NULL UNIQUE,
    reference  VARCHAR(100) NOT NULL,
    created_at DATETIME(6)  NOT NULL,
    INDEX pickup_reference_idx (reference)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE TABLE email (
    id         VARCHAR(36)  NOT NULL PRIMARY KEY,
    idem_key   VARCHAR(255) NOT NULL UNIQUE,
    recipient  VARCHAR(255) NOT NULL,
    subject    VARCHAR(255) NOT NULL,
    created_at DATETIME(6)  NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
`, `
ALTER TABLE pickup ADD COLUMN cancelled_at DATETIME(6) NULL;
ALTER TABLE pickup ADD COLUMN cancel_key VARCHAR(255) NULL;
`},
	store.SQLite: {`
CREATE TABLE pickup (
    id         TEXT      NOT NULL PRIMARY KEY,
    idem_key   TEXT      NOT NULL UNIQUE,
    reference  TEXT      NOT NULL,
    created_at timestamp NOT NULL
);
CREATE INDEX pickup_reference_idx ON pickup (reference);
CREATE TABLE email (
    id         TEXT      NOT NULL PRIMARY KEY,
    idem_key   TEXT      NOT NULL UNIQUE,
    recipient  TEXT      NOT NULL,
    subject    TEXT      NOT NULL,
    created_at timestamp NOT NULL
);
`, `
ALTER TABLE pickup ADD COLUMN cancelled_at timestamp;
ALTER TABLE pickup ADD COLUMN cancel_key TEXT;
`},
}

// Inserts that skip a request whose key was seen (the row affected tells),
// per dialect: MySQL/MariaDB has no ON CONFLICT, and its ON DUPLICATE KEY
// UPDATE of the key to itself affects no row either.
var (
	qInsertPickup = map[string]string{
		store.Postgres: `INSERT INTO pickup (id, idem_key, reference, created_at) VALUES ($1, $2, $3, $4) ON CONFLICT (idem_key) DO NOTHING`,
		store.MySQL:    `INSERT INTO pickup (id, idem_key, reference, created_at) VALUES (?, ?, ?, ?) ON DUPLICATE KEY UPDATE idem_key = idem_key`,
	}
	qInsertEmail = map[string]string{
		store.Postgres: `INSERT INTO email (id, idem_key, recipient, subject, created_at) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (idem_key) DO NOTHING`,
		store.MySQL:    `INSERT INTO email (id, idem_key, recipient, subject, created_at) VALUES (?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE idem_key = idem_key`,
	}
)

// Queries, written with $n placeholders (store.DB.Q adapts them).
const (
	qPickupByKey  = `SELECT id, reference, created_at, cancelled_at FROM pickup WHERE idem_key = $1`
	qPickupsByRef = `SELECT id, idem_key, created_at, cancelled_at FROM pickup WHERE reference = $1 ORDER BY created_at`
	qPickupByID   = `SELECT idem_key, reference, created_at, cancelled_at, COALESCE(cancel_key, '') FROM pickup WHERE id = $1`
	qCancelPickup = `UPDATE pickup SET cancelled_at = $1, cancel_key = $2 WHERE id = $3 AND cancelled_at IS NULL`
	qEmailByKey   = `SELECT id, recipient, subject, created_at FROM email WHERE idem_key = $1`
)

// Migrations returns the carrier's own migrations.
func Migrations() store.Migrations { return migrations }

// Pickup is a pickup the carrier accepted.
type Pickup struct {
	ID             string    `json:"id"`
	Reference      string    `json:"reference"`
	IdempotencyKey string    `json:"idempotency_key"`
	CreatedAt      time.Time `json:"created_at"`
	// CancelledAt is when the pickup was cancelled; nil while it stands.
	CancelledAt *time.Time `json:"cancelled_at,omitempty"`
}

// Email is an e-mail the mail service accepted.
type Email struct {
	ID             string    `json:"id"`
	To             string    `json:"to"`
	Subject        string    `json:"subject"`
	IdempotencyKey string    `json:"idempotency_key"`
	CreatedAt      time.Time `json:"created_at"`
}

// Stats counts the requests the service received since it started.
type Stats struct {
	PickupRequests int64 `json:"pickup_requests"`
	CancelRequests int64 `json:"cancel_requests"`
	EmailRequests  int64 `json:"email_requests"`
	Replayed       int64 `json:"replayed"`
	Dropped        int64 `json:"dropped"`
	Pickups        int64 `json:"pickups"`
	// Cancelled counts the pickups cancelled, among Pickups.
	Cancelled int64 `json:"cancelled"`
	Emails    int64 `json:"emails"`
}

// Server is the fake carrier.
type Server struct {
	db   *store.DB
	log  *slog.Logger
	drop atomic.Int64

	pickupRequests, cancelRequests, emailRequests, replayed, dropped atomic.Int64
}

// NewServer returns the carrier on db, whose migrations must be applied.
func NewServer(db *store.DB, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	return &Server{db: db, log: log.With("service", "carrier")}
}

// Handler returns the carrier's HTTP API, with paths under /carrier/.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /carrier/pickups", s.createPickup)
	mux.HandleFunc("GET /carrier/pickups", s.findPickups)
	mux.HandleFunc("POST /carrier/pickups/{id}/cancel", s.cancelPickup)
	mux.HandleFunc("POST /carrier/emails", s.createEmail)
	mux.HandleFunc("GET /carrier/emails", s.findEmail)
	mux.HandleFunc("POST /carrier/control", s.control)
	mux.HandleFunc("GET /carrier/stats", s.stats)
	return mux
}

// DropResponses makes the server process the next n pickup, cancellation
// or e-mail requests and then close their connections without answering.
func (s *Server) DropResponses(n int64) { s.drop.Store(n) }

func (s *Server) createPickup(w http.ResponseWriter, r *http.Request) {
	s.pickupRequests.Add(1)
	key := r.Header.Get("Idempotency-Key")
	var req struct {
		Reference string `json:"reference"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&req); err != nil || req.Reference == "" || key == "" {
		httpError(w, http.StatusBadRequest, "want a JSON body with reference and an Idempotency-Key header")
		return
	}
	ctx := r.Context()
	n, err := s.exec(ctx, s.db.Pick(qInsertPickup), uuid.NewString(), key, req.Reference, time.Now().UTC())
	if err != nil {
		httpError(w, http.StatusInternalServerError, err.Error())
		return
	}
	p := Pickup{IdempotencyKey: key}
	if err := s.db.SQL.QueryRowContext(ctx, s.db.Q(qPickupByKey), key).Scan(&p.ID, &p.Reference, &p.CreatedAt, &p.CancelledAt); err != nil {
		httpError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if p.Reference != req.Reference {
		httpError(w, http.StatusUnprocessableEntity, "this Idempotency-Key was used for another reference")
		return
	}
	s.answer(w, n, p)
}

func (s *Server) findPickups(w http.ResponseWriter, r *http.Request) {
	ref := r.URL.Query().Get("reference")
	rows, err := s.db.SQL.QueryContext(r.Context(), s.db.Q(qPickupsByRef), ref)
	if err != nil {
		httpError(w, http.StatusInternalServerError, err.Error())
		return
	}
	defer rows.Close()
	out := []Pickup{}
	for rows.Next() {
		p := Pickup{Reference: ref}
		if err := rows.Scan(&p.ID, &p.IdempotencyKey, &p.CreatedAt, &p.CancelledAt); err != nil {
			httpError(w, http.StatusInternalServerError, err.Error())
			return
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		httpError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// cancelPickup cancels a pickup. Cancelling is idempotent: a pickup
// cancelled already is answered 200 as it is, with Idempotent-Replayed
// when the key is the one it was cancelled with.
func (s *Server) cancelPickup(w http.ResponseWriter, r *http.Request) {
	s.cancelRequests.Add(1)
	key, id := r.Header.Get("Idempotency-Key"), r.PathValue("id")
	if key == "" {
		httpError(w, http.StatusBadRequest, "want an Idempotency-Key header")
		return
	}
	ctx := r.Context()
	n, err := s.exec(ctx, s.db.Q(qCancelPickup), time.Now().UTC(), key, id)
	if err != nil {
		httpError(w, http.StatusInternalServerError, err.Error())
		return
	}
	p := Pickup{ID: id}
	var cancelKey string
	err = s.db.SQL.QueryRowContext(ctx, s.db.Q(qPickupByID), id).Scan(&p.IdempotencyKey, &p.Reference, &p.CreatedAt, &p.CancelledAt, &cancelKey)
	if errors.Is(err, sql.ErrNoRows) {
		httpError(w, http.StatusNotFound, "no pickup "+id)
		return
	}
	if err != nil {
		httpError(w, http.StatusInternalServerError, err.Error())
		return
	}
	// Cancelled before under another key: answered as it is, but not as
	// a replay of this request.
	s.reply(w, http.StatusOK, n == 0 && cancelKey == key, p)
}

func (s *Server) createEmail(w http.ResponseWriter, r *http.Request) {
	s.emailRequests.Add(1)
	key := r.Header.Get("Idempotency-Key")
	var req struct {
		To      string `json:"to"`
		Subject string `json:"subject"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&req); err != nil || req.To == "" || key == "" {
		httpError(w, http.StatusBadRequest, "want a JSON body with to and subject and an Idempotency-Key header")
		return
	}
	ctx := r.Context()
	n, err := s.exec(ctx, s.db.Pick(qInsertEmail), uuid.NewString(), key, req.To, req.Subject, time.Now().UTC())
	if err != nil {
		httpError(w, http.StatusInternalServerError, err.Error())
		return
	}
	e := Email{IdempotencyKey: key}
	if err := s.db.SQL.QueryRowContext(ctx, s.db.Q(qEmailByKey), key).Scan(&e.ID, &e.To, &e.Subject, &e.CreatedAt); err != nil {
		httpError(w, http.StatusInternalServerError, err.Error())
		return
	}
	s.answer(w, n, e)
}

// findEmail answers the e-mail sent with the idempotency key of the query,
// or 404.
func (s *Server) findEmail(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("key")
	e := Email{IdempotencyKey: key}
	err := s.db.SQL.QueryRowContext(r.Context(), s.db.Q(qEmailByKey), key).Scan(&e.ID, &e.To, &e.Subject, &e.CreatedAt)
	if errors.Is(err, sql.ErrNoRows) {
		httpError(w, http.StatusNotFound, "no e-mail sent with key "+key)
		return
	}
	if err != nil {
		httpError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, e)
}

// answer writes 201 for a new resource and 200 with Idempotent-Replayed for
// a repeated key, unless the response is to be dropped.
func (s *Server) answer(w http.ResponseWriter, inserted int64, v any) {
	if inserted == 0 {
		s.reply(w, http.StatusOK, true, v)
		return
	}
	s.reply(w, http.StatusCreated, false, v)
}

// reply writes status and v, with Idempotent-Replayed when replayed, or
// drops the answer when told to.
func (s *Server) reply(w http.ResponseWriter, status int, replayed bool, v any) {
	if s.drop.Load() > 0 && s.drop.Add(-1) >= 0 {
		s.dropped.Add(1)
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				_ = conn.Close()
				s.log.Info("answer dropped on purpose")
				return
			}
		}
	}
	if replayed {
		s.replayed.Add(1)
		w.Header().Set("Idempotent-Replayed", "true")
	}
	writeJSON(w, status, v)
}

func (s *Server) control(w http.ResponseWriter, r *http.Request) {
	var req struct {
		DropResponses int64 `json:"drop_responses"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&req); err != nil || req.DropResponses < 0 {
		httpError(w, http.StatusBadRequest, `want {"drop_responses": N}`)
		return
	}
	s.DropResponses(req.DropResponses)
	writeJSON(w, http.StatusOK, req)
}

func (s *Server) stats(w http.ResponseWriter, r *http.Request) {
	st, err := s.Stats(r.Context())
	if err != nil {
		httpError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// Stats returns the server's counters and the number of pickups and e-mails
// stored.
func (s *Server) Stats(ctx context.Context) (Stats, error) {
	st := Stats{
		PickupRequests: s.pickupRequests.Load(), CancelRequests: s.cancelRequests.Load(), EmailRequests: s.emailRequests.Load(),
		Replayed: s.replayed.Load(), Dropped: s.dropped.Load(),
	}
	var err error
	if st.Pickups, err = s.db.Count(ctx, `SELECT count(*) FROM pickup`); err != nil {
		return st, err
	}
	if st.Cancelled, err = s.db.Count(ctx, `SELECT count(*) FROM pickup WHERE cancelled_at IS NOT NULL`); err != nil {
		return st, err
	}
	st.Emails, err = s.db.Count(ctx, `SELECT count(*) FROM email`)
	return st, err
}

// exec runs query, in the database's dialect, and returns the number of
// rows it affected.
func (s *Server) exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := s.db.SQL.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func httpError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"status": status, "detail": msg})
}

// ErrNoPickup is returned by Client.FindPickup when the carrier has no
// pickup with the reference.
var ErrNoPickup = errors.New("carrier: no pickup with this reference")

// Client calls the carrier. Its errors say what a retry can do, as a
// consumer's handler must (idempotency.ClassifyStatus and
// ClassifyTransport): a failure of the carrier of the moment (a 5xx, 408,
// 409, 425 or 429 answer, a refused, reset or dropped connection, a
// timeout) is wrapped with idem.Transient, so that the consumer waits and
// tries again without counting attempts; an answer that refuses the request
// (any other 4xx) is wrapped with idem.Permanent, so that the message is
// parked. Every call sends the same idempotency key at every attempt
// (idempotency.Do), so a retry never does the work twice.
type Client struct {
	// BaseURL is the carrier's address, such as http://127.0.0.1:8080/carrier.
	BaseURL string
	// HTTP defaults to a client with a 10s timeout.
	HTTP *http.Client
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return &http.Client{Timeout: 10 * time.Second}
}

func (c *Client) post(ctx context.Context, path, key string, body, out any) error {
	raw, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.BaseURL+path, bytes.NewReader(raw))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	return c.do(req, out)
}

// do sends req and decodes a 200 or 201 answer into out. Its errors say
// what retrying can do (see Client), as package idempotency classifies
// them.
func (c *Client) do(req *http.Request, out any) error {
	what := "carrier: " + req.Method + " " + strings.TrimPrefix(req.URL.Path, c.basePath())
	resp, err := c.http().Do(req)
	if err != nil {
		return idempotency.ClassifyTransport(req.Context(), fmt.Errorf("%s: %w", what, err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return idempotency.ClassifyStatus(resp.StatusCode, fmt.Errorf("%s: %w", what, &statusError{resp.StatusCode, resp.Status, string(bytes.TrimSpace(msg))}))
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		err = fmt.Errorf("%s: read the answer: %w", what, err)
		if errors.Is(err, io.EOF) {
			return err // an empty answer: the carrier's fault, not the connection's
		}
		// A body cut short (unexpected EOF, reset) is a connection lost
		// mid-answer.
		return idempotency.ClassifyTransport(req.Context(), err)
	}
	return nil
}

// statusError is an answer of the carrier that is not a success.
type statusError struct {
	code        int
	status, msg string
}

func (e *statusError) Error() string { return e.status + ": " + e.msg }

func (c *Client) basePath() string {
	if u, err := url.Parse(c.BaseURL); err == nil {
		return u.Path
	}
	return ""
}

// RequestPickup asks the carrier to pick up the parcel of reference, with
// the stable idempotency key key (shipment:<order id>:initial): every
// attempt of this operation sends the same key, so the carrier creates one
// pickup whatever the number of attempts. When the answer is lost (or the
// carrier failed to give one), the client first looks the pickup up by
// reference, and asks again (with the same key) only if the carrier has
// none (idempotency.Do). An answer that refuses the request (a 4xx) is
// returned at once.
func (c *Client) RequestPickup(ctx context.Context, reference, key string) (Pickup, error) {
	return idempotency.Do(ctx, idempotency.Call[Pickup]{
		Key: key,
		Send: func(ctx context.Context, key string) (Pickup, error) {
			var p Pickup
			return p, c.post(ctx, "/pickups", key, map[string]string{"reference": reference}, &p)
		},
		Lookup: func(ctx context.Context) (Pickup, bool, error) {
			p, err := c.FindPickup(ctx, reference)
			if errors.Is(err, ErrNoPickup) {
				return Pickup{}, false, nil
			}
			return p, err == nil, err
		},
		Logger: c.logger().With("service", "carrier client", "reference", reference),
	})
}

// FindPickup returns the pickup with reference, or ErrNoPickup.
func (c *Client) FindPickup(ctx context.Context, reference string) (Pickup, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.BaseURL+"/pickups?reference="+url.QueryEscape(reference), nil)
	if err != nil {
		return Pickup{}, err
	}
	var list []Pickup
	if err := c.do(req, &list); err != nil {
		return Pickup{}, err
	}
	if len(list) == 0 {
		return Pickup{}, ErrNoPickup
	}
	return list[0], nil
}

// CancelPickup asks the carrier to cancel the pickup id, with the stable
// idempotency key key (shipment:<order id>:cancel). Cancelling is
// idempotent at the carrier, so a lost answer is met by asking again with
// the same key; the carrier answers a pickup cancelled already as it is.
func (c *Client) CancelPickup(ctx context.Context, id, key string) (Pickup, error) {
	path := "/pickups/" + url.PathEscape(id) + "/cancel"
	return idempotency.Do(ctx, idempotency.Call[Pickup]{
		Key: key,
		Send: func(ctx context.Context, key string) (Pickup, error) {
			var p Pickup
			return p, c.post(ctx, path, key, struct{}{}, &p)
		},
	})
}

// SendEmail asks the mail service to send an e-mail once per key. A lost
// answer, or a failure of the moment, is met by asking again with the same
// key, which makes the second attempt safe.
func (c *Client) SendEmail(ctx context.Context, key, to, subject string) (Email, error) {
	body := map[string]string{"to": to, "subject": subject}
	return idempotency.Do(ctx, idempotency.Call[Email]{
		Key: key,
		Send: func(ctx context.Context, key string) (Email, error) {
			var e Email
			return e, c.post(ctx, "/emails", key, body, &e)
		},
	})
}

// ErrNoEmail is FindEmail's error when the mail service sent no e-mail
// with the key.
var ErrNoEmail = errors.New("carrier: no e-mail sent with this key")

// FindEmail returns the e-mail the mail service sent with the idempotency
// key key, or ErrNoEmail: what a sender whose answer, or whose own record
// of it, was lost looks up.
func (c *Client) FindEmail(ctx context.Context, key string) (Email, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.BaseURL+"/emails?key="+url.QueryEscape(key), nil)
	if err != nil {
		return Email{}, err
	}
	var e Email
	err = c.do(req, &e)
	var se *statusError
	if errors.As(err, &se) && se.code == http.StatusNotFound {
		return Email{}, ErrNoEmail
	}
	return e, err
}

func (c *Client) logger() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.Default()
}
