package idempotency

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/errlog"
)

// Defaults of Config.
const (
	// TTLDefault is how long a key is remembered: a retry within it gets
	// the first response; after it the key is forgotten and may be used
	// again.
	TTLDefault = 24 * time.Hour
	// LockTimeoutDefault is how long a request holds its key while it
	// runs. A retry meanwhile gets 409 Conflict; after it, a retry takes
	// the key over (the request that held it is taken to have crashed).
	LockTimeoutDefault = 10 * time.Second
	// LockWaitDefault is how long ClaimTx and TxHandler wait for a
	// concurrent request with the same key to end before answering that
	// it is in progress.
	LockWaitDefault = 5 * time.Second
	// PurgeIntervalDefault is how often a Purger deletes expired keys.
	PurgeIntervalDefault = 10 * time.Minute
	// PurgeBatchSizeDefault is how many keys one purge statement deletes
	// at most.
	PurgeBatchSizeDefault = 1000
	// MaxBodyBytesDefault is the largest request body the middleware reads
	// to fingerprint a request with a key.
	MaxBodyBytesDefault = 1 << 20
	// MaxResponseBytesDefault is the largest response the middleware
	// records for a handler that did not complete its key itself.
	MaxResponseBytesDefault = 1 << 20
)

// MaxKeyLength is the longest key accepted, in bytes. It is also the
// longest scope and fingerprint.
const MaxKeyLength = 255

// Header field names.
const (
	// HeaderKey is the request header field carrying the key.
	HeaderKey = "Idempotency-Key"
	// HeaderReplayed is set to "true" on a replayed response.
	HeaderReplayed = "Idempotent-Replayed"
)

// Config configures Keys. The zero value is valid.
type Config struct {
	// TTL is how long a key is remembered after its claim. Defaults to
	// TTLDefault (24h). Publish it to your clients: a retry after it runs
	// the request again.
	TTL time.Duration
	// LockTimeout is how long a running request holds its key. A retry
	// within it gets 409; after it, a retry takes the key over and runs,
	// and the first request can no longer complete (ErrClaimLost). Set it
	// above the longest time a request may run. Defaults to
	// LockTimeoutDefault (10s).
	LockTimeout time.Duration
	// LockWait is how long ClaimTx (and TxHandler) waits for a concurrent
	// request with the same key, whose transaction holds it, to commit or
	// roll back: then it finds the response to replay, or runs. After it,
	// the outcome is InProgress (409). On MySQL/MariaDB the wait is
	// InnoDB's (innodb_lock_wait_timeout, 50s by default), and its end an
	// error (TxHandler: 503 with Retry-After); on SQLite it is the wait for
	// the database's write lock (the busy timeout) or, with the idem SQLite
	// driver's single connection, for the pool. Defaults to
	// LockWaitDefault (5s).
	LockWait time.Duration
	// PurgeInterval is how often a Purger deletes expired keys, with 10%
	// jitter. Defaults to PurgeIntervalDefault (10m).
	PurgeInterval time.Duration
	// PurgeBatchSize is how many keys one purge statement deletes at most.
	// Defaults to PurgeBatchSizeDefault (1000).
	PurgeBatchSize int
	// MaxBodyBytes is the largest request body the middleware reads to
	// fingerprint a request with a key; a larger one is answered 413.
	// Defaults to MaxBodyBytesDefault (1 MiB).
	MaxBodyBytes int64
	// MaxResponseBytes is the largest response the middleware records for
	// a handler that did not complete its key itself; a larger one is
	// sent but not recorded (the key is released). Defaults to
	// MaxResponseBytesDefault (1 MiB).
	MaxResponseBytes int
	// Required makes the middleware answer 400 to a request without an
	// Idempotency-Key. By default such a request runs without one.
	Required bool
	// Scope returns who a request's key belongs to (an account, a client
	// id from authentication), so that two clients' keys never meet. Nil
	// means one scope for every request: keys are then unique per server.
	// It must not return more than MaxKeyLength bytes, control characters
	// or spaces at either end.
	Scope func(r *http.Request) string
	// Fingerprint identifies a request's content, to tell a retry (same
	// fingerprint: replay) from another request sent with the same key
	// (422). Defaults to Fingerprint(r.Method, target, body), where target
	// is the path and, when there is one, "?" and the raw query. It must
	// return 1 to MaxKeyLength bytes of text without control characters.
	Fingerprint func(r *http.Request, body []byte) string
	// Error writes the middleware's error answers (400, 409, 413, 422, 500,
	// 503). Defaults to Problem, an RFC 9457 problem document.
	Error func(w http.ResponseWriter, r *http.Request, status int, detail string)
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// ErrorLog logs the failures of requests (the database away, a
	// handler's error): the first of each cause at once, its repeats once
	// per interval, and a line when requests succeed again (package
	// errlog). Pass the limiter of the service's own handlers, so that an
	// outage shows as one set of lines. Defaults to a limiter of its own on
	// Logger, named "idempotent requests".
	ErrorLog *errlog.Limiter
	// Now is the clock of claims, expiry and locks. Defaults to time.Now.
	// Servers sharing the table must agree on the time within much less
	// than LockTimeout.
	Now func() time.Time
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	c.TTL = cmp.Or(c.TTL, TTLDefault)
	c.LockTimeout = cmp.Or(c.LockTimeout, LockTimeoutDefault)
	c.LockWait = cmp.Or(c.LockWait, LockWaitDefault)
	c.PurgeInterval = cmp.Or(c.PurgeInterval, PurgeIntervalDefault)
	c.PurgeBatchSize = cmp.Or(c.PurgeBatchSize, PurgeBatchSizeDefault)
	c.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, MaxBodyBytesDefault)
	c.MaxResponseBytes = cmp.Or(c.MaxResponseBytes, MaxResponseBytesDefault)
	if c.Fingerprint == nil {
		c.Fingerprint = func(r *http.Request, body []byte) string {
			return Fingerprint(r.Method, requestTarget(r), body)
		}
	}
	if c.Error == nil {
		c.Error = Problem
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.ErrorLog == nil {
		c.ErrorLog = errlog.New(c.Logger.With("component", "idempotency"), "idempotent requests", errlog.Config{})
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.TTL < 0:
		return fmt.Errorf("idem: idempotency: Config.TTL %v is negative", c.TTL)
	case c.LockTimeout < 0:
		return fmt.Errorf("idem: idempotency: Config.LockTimeout %v is negative", c.LockTimeout)
	case c.LockWait < 0:
		return fmt.Errorf("idem: idempotency: Config.LockWait %v is negative", c.LockWait)
	case c.PurgeInterval < 0:
		return fmt.Errorf("idem: idempotency: Config.PurgeInterval %v is negative", c.PurgeInterval)
	case c.PurgeBatchSize < 0:
		return fmt.Errorf("idem: idempotency: Config.PurgeBatchSize %d is negative", c.PurgeBatchSize)
	case c.MaxBodyBytes < 0:
		return fmt.Errorf("idem: idempotency: Config.MaxBodyBytes %d is negative", c.MaxBodyBytes)
	case c.MaxResponseBytes < 0:
		return fmt.Errorf("idem: idempotency: Config.MaxResponseBytes %d is negative", c.MaxResponseBytes)
	}
	return nil
}

// Keys stores the idempotency keys of incoming requests in the
// idempotent_request table (idem's migration 0004) of a database, through
// an idem driver whose transactions have type TTx. Its Middleware handles
// the Idempotency-Key header; Claim, Complete and Release are the same
// steps for other protocols. Safe for concurrent use.
type Keys[TTx any] struct {
	drv   driver.Driver[TTx]
	store driver.IdempotencyKeys
	cfg   Config
	log   *slog.Logger
	errs  *errlog.Limiter
}

// New returns the keys stored through drv, whose migrations must be applied
// (idem migrate up, or migrate.New(drv).Up).
func New[TTx any](drv driver.Driver[TTx], cfg Config) (*Keys[TTx], error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	store := drv.Dialect()
	cfg = cfg.WithDefaults()
	return &Keys[TTx]{drv: drv, store: store, cfg: cfg, log: cfg.Logger.With("component", "idempotency"), errs: cfg.ErrorLog}, nil
}

// Request names a request made with an idempotency key.
type Request struct {
	// Scope is who the key belongs to, or "" when keys are shared by every
	// client (see Config.Scope).
	Scope string
	// Key is the client's idempotency key (see ValidateKey).
	Key string
	// Fingerprint identifies the request's content (see Fingerprint): the
	// same key with another fingerprint is another request.
	Fingerprint string
}

// Outcome is what Claim found for a key.
type Outcome int

// Outcomes of Claim.
const (
	// Claimed: the key is the caller's. Run the request, then Complete the
	// key with the response (in the request's transaction), or Release
	// it if the request failed without effect.
	Claimed Outcome = iota + 1
	// Replay: the request was completed before; answer Claim.Response.
	Replay
	// InProgress: another request with the key is running; answer 409
	// Conflict, with Retry-After.
	InProgress
	// Mismatch: the key was used with another request (another
	// fingerprint); answer 422 Unprocessable Content.
	Mismatch
)

// String returns the outcome's name.
func (o Outcome) String() string {
	switch o {
	case Claimed:
		return "claimed"
	case Replay:
		return "replay"
	case InProgress:
		return "in progress"
	case Mismatch:
		return "mismatch"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Response is the response of a request, as Complete stores it and a
// replay sends it.
type Response struct {
	// Status is the status code.
	Status int
	// Header holds the header fields to replay. Connection-specific
	// fields, Date, Content-Length and Set-Cookie are never stored.
	Header http.Header
	// Body is the body, byte for byte.
	Body []byte
}

// Send writes r to w: its header fields, its status and its body.
func (r Response) Send(w http.ResponseWriter) {
	for k, v := range r.Header {
		w.Header()[k] = append([]string(nil), v...)
	}
	w.WriteHeader(r.Status)
	_, _ = w.Write(r.Body)
}

// Claim is the result of Claim: the key's outcome and, for a claimed key,
// what Complete and Release need. Safe for concurrent use.
type Claim struct {
	Request
	// Outcome says what to do.
	Outcome Outcome
	// Response is the stored response, when Outcome is Replay.
	Response Response
	// LockedUntil is, when Outcome is Claimed, the time until which the
	// key is the caller's; when InProgress, the time after which a retry
	// may take the key over.
	LockedUntil time.Time

	owner     string
	mu        sync.Mutex
	completed int // the status Complete stored, 0 before
}

func (c *Claim) completedWith() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.completed
}

// ErrClaimLost is returned by Complete when the key is no longer the
// claim's: its lock timed out and a retry took it over (or it expired and
// was purged). Roll the transaction back and answer 409 Conflict: the
// retry that took the key over runs the request.
var ErrClaimLost = errors.New("idem: idempotency: the key was taken over by a retry after the lock timeout; roll back and answer 409 Conflict")

// Claim claims req's key for the caller, in a statement committed at once,
// so that a concurrent retry sees it. A key expired (Config.TTL) is
// claimed afresh, whatever its request was; a key whose request did not
// complete within Config.LockTimeout (it crashed) is taken over by a
// request with the same fingerprint. The returned Claim says what to do
// (see Outcome); err is set only when the database could not answer, or
// req is invalid.
func (k *Keys[TTx]) Claim(ctx context.Context, req Request) (*Claim, error) {
	if err := validateRequest(req); err != nil {
		return nil, err
	}
	return k.claim(ctx, k.drv.Pool(), req)
}

// claim claims req's key through ex: the pool (Claim) or the transaction
// of ClaimTx.
func (k *Keys[TTx]) claim(ctx context.Context, pool driver.Executor, req Request) (*Claim, error) {
	ref := driver.IdempotencyKeyRef{Scope: req.Scope, Key: req.Key}
	owner := uuid.NewString()
	for range 3 {
		now := k.now()
		p := driver.IdempotencyKeyClaimParams{
			IdempotencyKeyRef: ref, Fingerprint: req.Fingerprint, Owner: owner,
			Now: now, LockedUntil: now.Add(k.cfg.LockTimeout), ExpiresAt: now.Add(k.cfg.TTL),
		}
		inserted, err := k.store.InsertIdempotencyKey(ctx, pool, p)
		if err != nil {
			return nil, fmt.Errorf("idem: idempotency: claim key: %w", err)
		}
		if inserted {
			return &Claim{Request: req, Outcome: Claimed, owner: owner, LockedUntil: p.LockedUntil}, nil
		}
		cur, err := k.store.GetIdempotencyKey(ctx, pool, ref)
		if errors.Is(err, idem.ErrNotFound) {
			continue // released or purged meanwhile: insert again
		}
		if err != nil {
			return nil, fmt.Errorf("idem: idempotency: read key: %w", err)
		}
		expired := !cur.ExpiresAt.After(now)
		crashed := !cur.Completed && !cur.LockedUntil.After(now) && cur.Fingerprint == req.Fingerprint
		switch {
		case expired || crashed:
			// Expired: the key is forgotten and starts a new request.
			// Crashed: the request that held it is gone (or outlived the
			// lock timeout); its completion, if it ever comes, fails on
			// the owner.
			p.PreviousOwner = cur.Owner
			ok, err := k.store.ReclaimIdempotencyKey(ctx, pool, p)
			if err != nil {
				return nil, fmt.Errorf("idem: idempotency: take key over: %w", err)
			}
			if ok {
				if crashed && !expired {
					k.log.Info("idempotency key taken over from a request that did not complete within the lock timeout",
						"scope", req.Scope, "key", req.Key, "locked_until", cur.LockedUntil)
				}
				return &Claim{Request: req, Outcome: Claimed, owner: owner, LockedUntil: p.LockedUntil}, nil
			}
			continue // changed meanwhile (completed, or taken by another retry): look again
		case cur.Fingerprint != req.Fingerprint:
			return &Claim{Request: req, Outcome: Mismatch}, nil
		case cur.Completed:
			resp, err := decodeResponse(cur)
			if err != nil {
				return nil, err
			}
			return &Claim{Request: req, Outcome: Replay, Response: resp}, nil
		default:
			return &Claim{Request: req, Outcome: InProgress, LockedUntil: cur.LockedUntil}, nil
		}
	}
	return &Claim{Request: req, Outcome: InProgress, LockedUntil: k.now().Add(time.Second)}, nil
}

// Complete stores resp as the response of c's request, in tx: commit tx
// with the request's business rows and outbox events, so that the key's
// response exists if and only if the work does. A nil c does nothing (a
// request without key). It returns ErrClaimLost when the key is no longer
// c's (see ErrClaimLost), and an error for a c whose Outcome is not
// Claimed or that was completed before.
func (k *Keys[TTx]) Complete(ctx context.Context, tx TTx, c *Claim, resp Response) error {
	if c == nil {
		return nil
	}
	if c.Outcome != Claimed {
		return fmt.Errorf("idem: idempotency: Complete on a key whose outcome is %q; only a claimed key is completed", c.Outcome)
	}
	if resp.Status < 100 || resp.Status > 999 {
		return fmt.Errorf("idem: idempotency: Complete with status %d; want a 3-digit HTTP status", resp.Status)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.completed != 0 {
		return errors.New("idem: idempotency: Complete called twice for one claim; complete a key once, with the response sent")
	}
	headers, err := encodeHeader(resp.Header)
	if err != nil {
		return err
	}
	ok, err := k.store.CompleteIdempotencyKey(ctx, k.drv.Tx(tx), driver.IdempotencyKeyCompleteParams{
		IdempotencyKeyRef: driver.IdempotencyKeyRef{Scope: c.Scope, Key: c.Key}, Owner: c.owner,
		Status: resp.Status, Headers: headers, Body: resp.Body, Now: k.now(),
	})
	if err != nil {
		return fmt.Errorf("idem: idempotency: complete key: %w", err)
	}
	if !ok {
		return ErrClaimLost
	}
	c.completed = resp.Status
	return nil
}

// completeNow stores the response of a request that did not complete its
// key itself, in a statement of its own.
func (k *Keys[TTx]) completeNow(ctx context.Context, c *Claim, resp Response) (bool, error) {
	headers, err := encodeHeader(resp.Header)
	if err != nil {
		return false, err
	}
	return k.store.CompleteIdempotencyKey(ctx, k.drv.Pool(), driver.IdempotencyKeyCompleteParams{
		IdempotencyKeyRef: driver.IdempotencyKeyRef{Scope: c.Scope, Key: c.Key}, Owner: c.owner,
		Status: resp.Status, Headers: headers, Body: resp.Body, Now: k.now(),
	})
}

// Release forgets c's key, still processing, so that a retry runs at once:
// call it when the request failed without effect (its transaction rolled
// back). A completed key, or one a retry took over, stays. A nil c, or one
// whose Outcome is not Claimed, does nothing.
func (k *Keys[TTx]) Release(ctx context.Context, c *Claim) error {
	if c == nil || c.Outcome != Claimed {
		return nil
	}
	_, err := k.store.ReleaseIdempotencyKey(ctx, k.drv.Pool(), driver.IdempotencyKeyRef{Scope: c.Scope, Key: c.Key}, c.owner)
	if err != nil {
		return fmt.Errorf("idem: idempotency: release key: %w", err)
	}
	return nil
}

// Purge deletes the keys expired by now, in statements of at most
// Config.PurgeBatchSize keys, and returns how many. It stops early, with
// what it deleted so far, when ctx is done.
func (k *Keys[TTx]) Purge(ctx context.Context) (int64, error) {
	before := k.now()
	var total int64
	for {
		n, err := k.store.PurgeIdempotencyKeys(ctx, k.drv.Pool(), driver.IdempotencyKeyPurgeParams{Before: before, Limit: k.cfg.PurgeBatchSize})
		total += n
		if err != nil {
			return total, fmt.Errorf("idem: idempotency: purge expired keys: %w", err)
		}
		if n < int64(k.cfg.PurgeBatchSize) || ctx.Err() != nil {
			return total, nil
		}
	}
}

func (k *Keys[TTx]) now() time.Time { return k.cfg.Now().UTC().Truncate(time.Microsecond) }

// Fingerprint is the default fingerprint of a request: the SHA-256 of its
// method, a space, its target (the path, then "?" and the raw query when
// there is one), a line feed, then the exact bytes of its body, in lower
// case hex. A retry must send the same bytes: the same content written
// another way (other spacing, another key order) is another request.
func Fingerprint(method, target string, body []byte) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s %s\n", method, target)
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

func requestTarget(r *http.Request) string {
	if r.URL.RawQuery != "" {
		return r.URL.Path + "?" + r.URL.RawQuery
	}
	return r.URL.Path
}

// ErrInvalidKey is matched (errors.Is) by the errors of ParseKey and
// ValidateKey: the key cannot be used, and the request must be refused
// (400), not run without it.
var ErrInvalidKey = errors.New("idem: idempotency: invalid key")

type invalidKeyError struct{ msg string }

func (e *invalidKeyError) Error() string        { return e.msg }
func (e *invalidKeyError) Is(target error) bool { return target == ErrInvalidKey }

const keyHint = "; send a unique value such as a UUID, the same at every retry of this request"

// ValidateKey reports why key cannot be used as an idempotency key: it
// must be 1 to MaxKeyLength bytes of UTF-8, without control characters or
// white space at either end (HTTP strips it, so a key with some could not
// be sent twice alike). Its errors match ErrInvalidKey and say what to
// send instead.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return &invalidKeyError{HeaderKey + " is empty" + keyHint}
	case len(key) > MaxKeyLength:
		return &invalidKeyError{fmt.Sprintf("%s is longer than %d bytes%s", HeaderKey, MaxKeyLength, keyHint)}
	case !utf8.ValidString(key):
		return &invalidKeyError{HeaderKey + " is not valid UTF-8" + keyHint}
	case strings.ContainsFunc(key, unicode.IsControl):
		return &invalidKeyError{HeaderKey + " contains control characters" + keyHint}
	case strings.TrimSpace(key) != key:
		return &invalidKeyError{HeaderKey + " starts or ends with white space" + keyHint}
	}
	return nil
}

// ParseKey returns the Idempotency-Key of a request's header and whether
// it has one, or why it cannot be used (matching ErrInvalidKey): present
// but empty, sent more than once, or invalid (see ValidateKey). The key is
// the field's value as sent: a client that quotes it, as the IETF draft's
// structured-field syntax does, sends the same quotes at every retry.
func ParseKey(h http.Header) (key string, present bool, err error) {
	vals, ok := h[HeaderKey]
	if !ok {
		return "", false, nil
	}
	if len(vals) > 1 {
		return "", true, &invalidKeyError{"the request has several " + HeaderKey + " headers" + keyHint}
	}
	if err := ValidateKey(vals[0]); err != nil {
		return "", true, err
	}
	return vals[0], true, nil
}

func validateRequest(req Request) error {
	if err := ValidateKey(req.Key); err != nil {
		return err
	}
	if err := validateText("Request.Scope", req.Scope, true); err != nil {
		return err
	}
	return validateText("Request.Fingerprint", req.Fingerprint, false)
}

func validateText(field, s string, mayBeEmpty bool) error {
	switch {
	case s == "" && !mayBeEmpty:
		return fmt.Errorf("idem: idempotency: %s is empty", field)
	case len(s) > MaxKeyLength:
		return fmt.Errorf("idem: idempotency: %s is longer than %d bytes; hash it", field, MaxKeyLength)
	case !utf8.ValidString(s), strings.ContainsFunc(s, unicode.IsControl):
		return fmt.Errorf("idem: idempotency: %s %q is not text without control characters; encode it (hex, base64)", field, s)
	case strings.TrimSpace(s) != s:
		return fmt.Errorf("idem: idempotency: %s %q starts or ends with white space; trim it", field, s)
	}
	return nil
}

// Header fields that are never stored: they describe one connection or one
// sending of the response, or hand out credentials.
var unstoredHeaders = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Transfer-Encoding": true,
	"Upgrade": true, "Trailer": true, "Te": true, "Date": true, "Content-Length": true,
	"Set-Cookie": true, HeaderReplayed: true,
}

func encodeHeader(h http.Header) (string, error) {
	stored := http.Header{}
	for k, v := range h {
		ck := http.CanonicalHeaderKey(k)
		if unstoredHeaders[ck] || len(v) == 0 {
			continue
		}
		stored[ck] = append(stored[ck], v...)
	}
	if len(stored) == 0 {
		return "", nil
	}
	b, err := json.Marshal(stored)
	if err != nil {
		return "", fmt.Errorf("idem: idempotency: encode the response's header: %w", err)
	}
	return string(b), nil
}

func decodeResponse(k driver.IdempotencyKey) (Response, error) {
	resp := Response{Status: k.Status, Body: k.Body, Header: http.Header{}}
	if k.Headers != "" {
		if err := json.Unmarshal([]byte(k.Headers), &resp.Header); err != nil {
			return Response{}, fmt.Errorf("idem: idempotency: the stored header of key %q is not a JSON object of string arrays (%v); delete the key's row to run the request again", k.Key, err)
		}
	}
	return resp, nil
}
