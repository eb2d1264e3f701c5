package order

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/errlog"
	"github.com/idem-go/idem/idempotency"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/shop"
	"github.com/idem-go/idem/shop/store"
)

// ConsumerName is the name of the order service's consumer of shipping's
// events.
const ConsumerName = "order"

// Order statuses.
const (
	StatusConfirmed = "confirmed"
	StatusCancelled = "cancelled"
)

// Fulfilments: what shipping did with the order, as its events tell. They
// only move forward, in this order (a late event changes nothing). A
// cancelled order's fulfilment follows shipping's compensation: "cancelled"
// when no pickup was requested, "cancelling shipment" then "shipment
// cancelled" when the carrier had a pickup to cancel.
const (
	FulfilmentAwaiting           = "awaiting preparation" // no event from shipping yet
	FulfilmentPreparing          = "in preparation"       // shipping.preparation.created.v1
	FulfilmentShipment           = "shipment requested"   // shipping.shipment.requested.v1
	FulfilmentCancelled          = "cancelled"            // shipping.preparation.cancelled.v1, no pickup
	FulfilmentCancellingShipment = "cancelling shipment"  // shipping.preparation.cancelled.v1 with a pickup
	FulfilmentShipmentCancelled  = "shipment cancelled"   // shipping.shipment.cancelled.v1
)

// MaxLines is the largest number of lines an order may have.
const MaxLines = shop.MaxLines

// Idempotency-Key defaults (see package idempotency).
const (
	// KeyTTLDefault is how long an Idempotency-Key is remembered: a request
	// repeated within it with the same key and body gets the first response;
	// after it, the key is forgotten and may be used again.
	KeyTTLDefault = idempotency.TTLDefault
	// KeyLockTimeoutDefault is how long a request holds its key while it
	// runs. A retry meanwhile gets 409 Conflict. A request that crashed
	// leaves its key locked until then; a retry after it takes the key over.
	KeyLockTimeoutDefault = idempotency.LockTimeoutDefault
	// KeyPurgeIntervalDefault is how often expired keys are deleted.
	KeyPurgeIntervalDefault = idempotency.PurgeIntervalDefault
	// MaxKeyLength is the longest Idempotency-Key accepted.
	MaxKeyLength = idempotency.MaxKeyLength
)

// Migrations returns the order service's own migrations.
func Migrations() store.Migrations { return migrations }

// Config configures a Service. The zero value is valid.
type Config struct {
	// KeyTTL is how long Idempotency-Keys are remembered. Defaults to
	// KeyTTLDefault (24h).
	KeyTTL time.Duration
	// KeyLockTimeout is how long a running request holds its key. Defaults
	// to KeyLockTimeoutDefault (10s).
	KeyLockTimeout time.Duration
	// KeyLockWait is how long a retry waits for a request with its key
	// still running before it is answered 409. Defaults to
	// idempotency.LockWaitDefault (5s).
	KeyLockWait time.Duration
	// KeyPurgeInterval is how often expired keys are deleted. Defaults to
	// KeyPurgeIntervalDefault (10m).
	KeyPurgeInterval time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// ErrorLogInterval is how often the failures of requests that keep
	// failing (the database away) are logged again, as a count: the first
	// of each cause is logged at once, and a line says when requests
	// succeed again (package errlog). Defaults to errlog.IntervalDefault
	// (10s).
	ErrorLogInterval time.Duration
	// BeforeCommit, when set, runs in the transaction that places an
	// order, once the order, its lines and its event are written, just
	// before the transaction commits. It is a test hook: the shop command
	// built with the tag idemfault kills its process there, to show that
	// such an order leaves no row and no event behind.
	BeforeCommit func()
}

// Service is the order service.
type Service struct {
	db       *store.DB
	outbox   *outbox.Writer[*sql.Tx]
	keys     *idempotency.Keys[*sql.Tx]
	consumer *inbox.Consumer[*sql.Tx]
	placeTx  http.Handler
	cfg      Config
	log      *slog.Logger
	errs     *errlog.Limiter // the failures of requests
}

// New returns the order service on db, whose migrations must be applied.
func New(db *store.DB, cfg Config) (*Service, error) {
	if cfg.KeyTTL == 0 {
		cfg.KeyTTL = KeyTTLDefault
	}
	if cfg.KeyLockTimeout == 0 {
		cfg.KeyLockTimeout = KeyLockTimeoutDefault
	}
	if cfg.KeyPurgeInterval == 0 {
		cfg.KeyPurgeInterval = KeyPurgeIntervalDefault
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c, err := db.NewConsumer(inbox.Config{Name: ConsumerName, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	log := cfg.Logger.With("service", "order")
	errs := errlog.New(log, "order requests", errlog.Config{Interval: cfg.ErrorLogInterval})
	keys, err := idempotency.New(db.Driver, idempotency.Config{
		TTL: cfg.KeyTTL, LockTimeout: cfg.KeyLockTimeout, LockWait: cfg.KeyLockWait, PurgeInterval: cfg.KeyPurgeInterval,
		MaxBodyBytes: MaxBodyBytes, Logger: log, ErrorLog: errs,
		Error: func(w http.ResponseWriter, _ *http.Request, status int, detail string) { problem(w, status, detail) },
	})
	if err != nil {
		return nil, err
	}
	s := &Service{
		db:       db,
		outbox:   db.OutboxWriter(),
		keys:     keys,
		consumer: c,
		cfg:      cfg,
		log:      log,
		errs:     errs,
	}
	s.placeTx = keys.TxHandler(s.create)
	inbox.HandleJSON(c, shop.PreparationCreated, shop.ForOrder(s.onPreparationCreated))
	inbox.HandleJSON(c, shop.ShipmentRequested, shop.ForOrder(s.onShipmentRequested))
	inbox.HandleJSON(c, shop.PreparationCancelled, shop.ForOrder(s.onPreparationCancelled))
	inbox.HandleJSON(c, shop.ShipmentCancelled, shop.ForOrder(s.onShipmentCancelled))
	return s, nil
}

// Consumer returns the consumer of shipping's events.
func (s *Service) Consumer() *inbox.Consumer[*sql.Tx] { return s.consumer }

// Handler returns the HTTP API. Each request runs in an OpenTelemetry
// server span (named after its route, "POST /orders"), child of the
// client's span when the request carries a traceparent header: the events
// an order writes to the outbox carry that span's trace context, so the
// relay's and the consumers' spans join the request's trace.
//
// The handler answers every path: another method on one of its paths is
// 405 Method Not Allowed with an Allow header, any other path 404 Not
// Found, both problem documents as every error of the API. Mount it at "/"
// beside handlers with paths of their own (http.ServeMux sends each
// request to the longest pattern that matches).
func (s *Service) Handler() http.Handler {
	routes := []struct {
		method, path string
		handle       http.HandlerFunc
	}{
		// place checks the order, then placeTx claims the Idempotency-Key
		// in the order's transaction (400 for an unusable key, 422 for
		// another body, the stored response for a retry, which waits for a
		// request with its key still running; 409 after KeyLockWait).
		{http.MethodPost, "/orders", s.place},
		{http.MethodPost, "/orders/{id}/cancel", s.cancel},
		{http.MethodGet, "/orders/{id}", s.get}, // and HEAD
	}
	mux := http.NewServeMux()
	var paths []string
	allow := map[string][]string{}
	for _, rt := range routes {
		mux.HandleFunc(rt.method+" "+rt.path, rt.handle)
		if allow[rt.path] == nil {
			paths = append(paths, rt.path)
		}
		allow[rt.path] = append(allow[rt.path], rt.method)
		if rt.method == http.MethodGet {
			allow[rt.path] = append(allow[rt.path], http.MethodHead)
		}
	}
	// A pattern without a method is less specific than one with a method:
	// these take only the methods the routes above do not.
	for _, p := range paths {
		mux.Handle(p, methodNotAllowed(allow[p]))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		problem(w, http.StatusNotFound, fmt.Sprintf("nothing at %s; the API has POST /orders, GET /orders/{id} and POST /orders/{id}/cancel", r.URL.Path))
	})
	return otelhttp.NewHandler(mux, "order")
}

// methodNotAllowed answers 405 Method Not Allowed to a request on a path
// that takes only the methods in allow.
func methodNotAllowed(allow []string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		problem(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s %s is not allowed; use %s", r.Method, r.URL.Path, strings.Join(allow, " or ")))
	})
}

// Run deletes expired Idempotency-Keys at once, then every
// Config.KeyPurgeInterval (an idempotency.Purger), until ctx ends.
func (s *Service) Run(ctx context.Context) {
	p := s.keys.NewPurger()
	if err := p.Start(ctx); err != nil {
		s.log.Error("purger of expired idempotency keys not started", "error", err)
		return
	}
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = p.Stop(stopCtx)
}

// PlaceRequest is the body of POST /orders.
type PlaceRequest struct {
	CustomerID string        `json:"customer_id"`
	Lines      []RequestLine `json:"lines"`
}

// RequestLine is one line of a PlaceRequest.
type RequestLine struct {
	ProductID string `json:"product_id"`
	Quantity  string `json:"quantity"`
}

// Order is an order as the API shows it.
type Order struct {
	ID         string        `json:"id"`
	CustomerID string        `json:"customer_id"`
	Status     string        `json:"status"`
	Fulfilment string        `json:"fulfilment"`
	PickupID   string        `json:"pickup_id,omitempty"`
	Version    int64         `json:"version"`
	Lines      []RequestLine `json:"lines"`
	CreatedAt  time.Time     `json:"created_at"`
}

// MaxBodyBytes is the largest body POST /orders reads; a larger one is
// answered 413 Content Too Large.
const MaxBodyBytes = 1 << 20

// parsePlace reads the body of POST /orders: its JSON (checkBody), then
// the order's rules. Its errors are the detail of a 400 Bad Request.
func parsePlace(body []byte) (PlaceRequest, error) {
	var req PlaceRequest
	if len(bytes.TrimSpace(body)) == 0 {
		return req, errors.New("the body is empty; send an order such as " + exampleOrder)
	}
	if err := checkBody(body); err != nil {
		return req, err
	}
	if err := json.Unmarshal(body, &req); err != nil { // checkBody let through only what fits
		return req, errors.New("the body is not a valid order; send an order such as " + exampleOrder)
	}
	if !shop.ValidID(req.CustomerID) {
		return req, errors.New("customer_id must be 1 to 100 letters, digits, '.', '_', ':' or '-'")
	}
	if len(req.Lines) == 0 || len(req.Lines) > MaxLines {
		return req, fmt.Errorf("an order needs 1 to %d lines", MaxLines)
	}
	seen := map[string]bool{}
	for i, l := range req.Lines {
		if !shop.ValidID(l.ProductID) {
			return req, fmt.Errorf("lines[%d].product_id must be 1 to 100 letters, digits, '.', '_', ':' or '-'", i)
		}
		if seen[l.ProductID] {
			return req, fmt.Errorf("lines[%d]: product %s appears twice; use one line per product", i, l.ProductID)
		}
		seen[l.ProductID] = true
		q, err := shop.NormalizeQuantity(l.Quantity)
		if err != nil {
			return req, fmt.Errorf("lines[%d]: %v", i, err)
		}
		req.Lines[i].Quantity = q
	}
	return req, nil
}

// jsonContentType reports why a request's Content-Type is not JSON, or
// nil when it is: application/json or application/<anything>+json, with or
// without parameters, in UTF-8 (the only charset JSON has). A request with
// no Content-Type is refused too: RFC 9110 lets a server take such a body
// for application/octet-stream, and a browser sends none for a
// cross-site request that needs no preflight.
func jsonContentType(r *http.Request) error {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return errors.New("the request has no Content-Type; send the order as JSON with Content-Type: application/json")
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil {
		return fmt.Errorf("Content-Type %q cannot be parsed (%v); send Content-Type: application/json", ct, err)
	}
	if mt != "application/json" && !(strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")) {
		return fmt.Errorf("Content-Type %s is not JSON; send the order as JSON with Content-Type: application/json", mt)
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return fmt.Errorf("charset %s is not supported; send the order in UTF-8", cs)
	}
	return nil
}

type placeKey struct{}

// place checks the request before any database work, then hands it to the
// transactional handler (placeTx), whose transaction claims the
// Idempotency-Key.
func (s *Service) place(w http.ResponseWriter, r *http.Request) {
	if err := jsonContentType(r); err != nil {
		w.Header().Set("Accept-Post", "application/json")
		problem(w, http.StatusUnsupportedMediaType, err.Error())
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		problem(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than %d bytes, the most this API reads", tooLarge.Limit))
		return
	}
	if err != nil {
		problem(w, http.StatusBadRequest, "cannot read the body: "+err.Error())
		return
	}
	req, err := parsePlace(body)
	if err != nil {
		problem(w, http.StatusBadRequest, err.Error())
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body)) // fingerprinted by the key's handler
	s.placeTx.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), placeKey{}, req)))
}

// create writes the order, its lines and its event in tx, which holds the
// request's Idempotency-Key (idempotency.Keys.TxHandler): the key's claim,
// the order and the response to replay commit together, once.
func (s *Service) create(ctx context.Context, tx *sql.Tx, r *http.Request) (idempotency.Response, error) {
	req := r.Context().Value(placeKey{}).(PlaceRequest)
	id := idem.NewEventID().String() // a UUIDv7: unique and time-ordered
	now := time.Now().UTC().Truncate(time.Microsecond)
	payload := shop.OrderPlacedV1{OrderID: id, CustomerID: req.CustomerID}
	order := Order{ID: id, CustomerID: req.CustomerID, Status: StatusConfirmed, Fulfilment: FulfilmentAwaiting,
		Version: 1, Lines: req.Lines, CreatedAt: now}
	for _, l := range req.Lines {
		payload.Lines = append(payload.Lines, shop.OrderLine{ProductID: l.ProductID, Quantity: l.Quantity})
	}
	ev, err := idem.NewEvent(shop.OrderPlaced, shop.AggregateOrder, id, payload)
	if err != nil {
		return idempotency.Response{}, err
	}
	ev.AggregateVersion, ev.OccurredAt = 1, now
	body, err := json.Marshal(order)
	if err != nil {
		return idempotency.Response{}, err
	}
	if _, err := tx.ExecContext(ctx, s.db.Q(qInsertOrder), id, req.CustomerID, StatusConfirmed, FulfilmentAwaiting, now, now); err != nil {
		return idempotency.Response{}, fmt.Errorf("insert order: %w", err)
	}
	args := make([]any, 0, 4*len(req.Lines))
	for i, l := range req.Lines {
		args = append(args, id, i+1, l.ProductID, l.Quantity)
	}
	if _, err := tx.ExecContext(ctx, s.db.Q(insertLines(len(req.Lines))), args...); err != nil {
		return idempotency.Response{}, fmt.Errorf("insert order lines: %w", err)
	}
	if err := s.outbox.Add(ctx, tx, ev); err != nil {
		return idempotency.Response{}, err
	}
	if s.cfg.BeforeCommit != nil {
		s.cfg.BeforeCommit()
	}
	return idempotency.Response{Status: http.StatusCreated, Body: body, Header: http.Header{
		"Content-Type": {"application/json"},
		"Location":     {"/orders/" + id},
	}}, nil
}

// respond sends body with status, or a 500 problem when err is set. The
// failures are logged once per cause and interval while they repeat (the
// database away), the success after them in one line.
func (s *Service) respond(w http.ResponseWriter, status int, body []byte, err error) {
	if err != nil {
		s.errs.Error(context.Background(), "request failed", err)
		problem(w, http.StatusInternalServerError, "internal error; the request may be retried")
		return
	}
	s.errs.OK(context.Background())
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// cancel cancels an order whatever shipping did with it already: the
// services compensate on order.order.cancelled.v1 (stock releases the
// reservations, shipping cancels the preparation and any pickup at the
// carrier, billing voids the invoice), and the order's fulfilment shows
// shipping's result when its events arrive. A second cancel changes
// nothing and publishes nothing.
func (s *Service) cancel(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	id := r.PathValue("id")
	tx, err := s.db.SQL.BeginTx(ctx, nil)
	if err != nil {
		s.respond(w, 0, nil, err)
		return
	}
	defer func() { _ = tx.Rollback() }()
	var (
		status  string
		version int64
	)
	err = tx.QueryRowContext(ctx, s.db.Pick(qLockOrder), id).Scan(&status, &version)
	if errors.Is(err, sql.ErrNoRows) {
		problem(w, http.StatusNotFound, "no order "+id)
		return
	}
	if err != nil {
		s.respond(w, 0, nil, err)
		return
	}
	if status != StatusCancelled {
		version++
		now := time.Now().UTC()
		if _, err := tx.ExecContext(ctx, s.db.Q(qCancel), StatusCancelled, version, now, id); err != nil {
			s.respond(w, 0, nil, err)
			return
		}
		ev, err := idem.NewEvent(shop.OrderCancelled, shop.AggregateOrder, id, shop.OrderCancelledV1{OrderID: id})
		if err != nil {
			s.respond(w, 0, nil, err)
			return
		}
		ev.AggregateVersion = version
		if err := s.outbox.Add(ctx, tx, ev); err != nil {
			s.respond(w, 0, nil, err)
			return
		}
	}
	if err := tx.Commit(); err != nil {
		s.respond(w, 0, nil, err)
		return
	}
	s.writeOrder(w, r.Context(), id)
}

func (s *Service) get(w http.ResponseWriter, r *http.Request) {
	s.writeOrder(w, r.Context(), r.PathValue("id"))
}

func (s *Service) writeOrder(w http.ResponseWriter, ctx context.Context, id string) {
	o, err := s.Get(ctx, id)
	if errors.Is(err, sql.ErrNoRows) {
		problem(w, http.StatusNotFound, "no order "+id)
		return
	}
	if err != nil {
		s.respond(w, 0, nil, err)
		return
	}
	body, err := json.Marshal(o)
	s.respond(w, http.StatusOK, body, err)
}

// Get returns the order id, or sql.ErrNoRows.
func (s *Service) Get(ctx context.Context, id string) (Order, error) {
	var o Order
	err := s.db.SQL.QueryRowContext(ctx, s.db.Q(qGetOrder), id).Scan(&o.ID, &o.CustomerID, &o.Status, &o.Fulfilment, &o.PickupID, &o.Version, &o.CreatedAt)
	if err != nil {
		return o, err
	}
	rows, err := s.db.SQL.QueryContext(ctx, s.db.Q(qGetLines), id)
	if err != nil {
		return o, err
	}
	defer rows.Close()
	for rows.Next() {
		var l RequestLine
		if err := rows.Scan(&l.ProductID, &l.Quantity); err != nil {
			return o, err
		}
		o.Lines = append(o.Lines, l)
	}
	o.CreatedAt = o.CreatedAt.UTC()
	return o, rows.Err()
}

func (s *Service) onPreparationCreated(ctx context.Context, tx *sql.Tx, ev idem.Event, p shop.PreparationCreatedV1) error {
	return s.advance(ctx, tx, p.OrderID, FulfilmentPreparing, shop.PreparationCreatedVersion, "")
}

func (s *Service) onShipmentRequested(ctx context.Context, tx *sql.Tx, ev idem.Event, p shop.ShipmentRequestedV1) error {
	return s.advance(ctx, tx, p.OrderID, FulfilmentShipment, shop.ShipmentRequestedVersion, p.PickupID)
}

func (s *Service) onPreparationCancelled(ctx context.Context, tx *sql.Tx, ev idem.Event, p shop.PreparationCancelledV1) error {
	if p.PickupID != "" {
		return s.advance(ctx, tx, p.OrderID, FulfilmentCancellingShipment, shop.PreparationCancelledVersion, p.PickupID)
	}
	return s.advance(ctx, tx, p.OrderID, FulfilmentCancelled, shop.PreparationCancelledVersion, "")
}

func (s *Service) onShipmentCancelled(ctx context.Context, tx *sql.Tx, ev idem.Event, p shop.ShipmentCancelledV1) error {
	return s.advance(ctx, tx, p.OrderID, FulfilmentShipmentCancelled, shop.ShipmentCancelledVersion, p.PickupID)
}

// advance moves an order's fulfilment forward to rank, the version of the
// preparation aggregate after shipping's event (shop.PreparationCreatedVersion
// ...), with pickupID when it is not empty; an event that arrives after a
// later one changes nothing.
func (s *Service) advance(ctx context.Context, tx *sql.Tx, orderID, fulfilment string, rank int, pickupID string) error {
	var pickup any
	if pickupID != "" {
		pickup = pickupID
	}
	_, err := tx.ExecContext(ctx, s.db.Q(qFulfilment), fulfilment, rank, pickup, time.Now().UTC(), orderID, rank)
	return err
}

func problem(w http.ResponseWriter, status int, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"type": "about:blank", "title": http.StatusText(status), "status": status, "detail": detail,
	})
}
