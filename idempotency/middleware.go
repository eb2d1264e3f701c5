package idempotency

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// Middleware returns next behind the Idempotency-Key header (IETF httpapi
// draft "The Idempotency-Key HTTP Header Field"). Mount it on the routes
// whose methods are not idempotent (POST, PATCH); GET, HEAD, OPTIONS and
// TRACE requests pass through untouched.
//
// A request without the header runs as it is (400 with Config.Required). A
// request with it:
//
//   - is refused with 400 when the key is unusable (empty, sent twice,
//     longer than MaxKeyLength bytes, not UTF-8, control characters): it
//     never runs without the key its client relies on;
//   - has its body read (413 beyond Config.MaxBodyBytes) and fingerprinted
//     (Config.Fingerprint), then claims its key (see Keys.Claim);
//   - gets the stored response of a completed request with the same key
//     and fingerprint, with Idempotent-Replayed: true;
//   - gets 409 Conflict with Retry-After: 1 while a request with the key
//     runs, and 422 Unprocessable Content when the key was used with
//     another request;
//   - otherwise runs next, with the claim in its context (ClaimFrom).
//
// The handler completes the key in its own transaction, with its business
// rows and outbox events, before it commits: Keys.Complete(ctx, tx,
// ClaimFrom(r.Context()), response); then it sends that response. A
// handler that does not complete its key (it writes no database rows, or
// its effects are idempotent themselves) has a 2xx response recorded by the
// middleware after it is sent: a crash in between leaves the key to be
// taken over after Config.LockTimeout, and the request runs again. Any
// other response (an error) releases the key, so that a retry runs at
// once, and so does a panic.
func (k *Keys[TTx]) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
			next.ServeHTTP(w, r)
			return
		}
		key, present, err := ParseKey(r.Header)
		if err != nil {
			k.cfg.Error(w, r, http.StatusBadRequest, err.Error())
			return
		}
		if !present {
			if k.cfg.Required {
				k.cfg.Error(w, r, http.StatusBadRequest, "this request needs an "+HeaderKey+" header"+keyHint)
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		req, ok := k.readRequest(w, r, key)
		if !ok {
			return
		}
		ctx := r.Context()
		c, err := k.Claim(ctx, req)
		if err != nil {
			k.errs.Error(ctx, "idempotency key not claimed", err, "key", key)
			if k.drv.Dialect().IsTransient(err) {
				w.Header().Set("Retry-After", "1")
				k.cfg.Error(w, r, http.StatusServiceUnavailable, "the "+HeaderKey+" cannot be checked now; retry the request with the same key")
				return
			}
			k.cfg.Error(w, r, http.StatusInternalServerError, "the "+HeaderKey+" could not be checked; retry the request with the same key")
			return
		}
		k.errs.OK(ctx)
		if k.answerUnclaimed(w, r, c) {
			return
		}

		rec := &recorder{ResponseWriter: w, claim: c, max: k.cfg.MaxResponseBytes}
		finished := false
		defer func() {
			if !finished { // the handler panicked
				k.release(ctx, c)
			}
		}()
		next.ServeHTTP(rec, r.WithContext(context.WithValue(ctx, claimKey{}, c)))
		finished = true
		k.finish(ctx, c, rec)
	})
}

// finish records or releases c's key once its handler returned.
func (k *Keys[TTx]) finish(ctx context.Context, c *Claim, rec *recorder) {
	status := rec.status
	if status == 0 {
		status = http.StatusOK // nothing written: net/http sends 200
	}
	if done := c.completedWith(); done != 0 {
		if done != status {
			// Completed in a transaction that did not commit: the handler
			// answered an error.
			k.release(ctx, c)
		}
		return
	}
	if status < 200 || status > 299 {
		k.release(ctx, c)
		return
	}
	if rec.overflow {
		k.log.Warn("response too large to be recorded for its idempotency key; a retry will run the request again", "key", c.Key, "max_bytes", k.cfg.MaxResponseBytes)
		k.release(ctx, c)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.cfg.LockTimeout)
	defer cancel()
	ok, err := k.completeNow(ctx, c, Response{Status: status, Header: rec.sent, Body: rec.body.Bytes()})
	switch {
	case err != nil:
		k.errs.Error(ctx, "response not recorded for its idempotency key; a retry after the lock timeout will run the request again", err, "key", c.Key)
	case !ok:
		k.log.Warn("response not recorded: the idempotency key was taken over by a retry", "key", c.Key)
	default:
		k.errs.OK(ctx)
	}
}

// release forgets c's key after its request, whatever the request's context.
func (k *Keys[TTx]) release(ctx context.Context, c *Claim) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.cfg.LockTimeout)
	defer cancel()
	if err := k.Release(ctx, c); err != nil {
		k.errs.Warn(ctx, "idempotency key not released; a retry gets 409 until the lock timeout", err, "key", c.Key)
		return
	}
	k.errs.OK(ctx)
}

type claimKey struct{}

// ClaimFrom returns the claim the middleware made for the request whose
// context is ctx, or nil when the request has no Idempotency-Key. Pass it to
// Keys.Complete, which does nothing with nil.
func ClaimFrom(ctx context.Context) *Claim {
	c, _ := ctx.Value(claimKey{}).(*Claim)
	return c
}

// recorder passes a response through, noting its status and, while the
// handler has not completed its key, keeping a copy to record.
type recorder struct {
	http.ResponseWriter
	claim    *Claim
	max      int
	status   int
	sent     http.Header
	body     bytes.Buffer
	keep     bool
	overflow bool
}

func (rec *recorder) WriteHeader(code int) {
	if rec.status == 0 && code >= 200 {
		rec.status = code
		rec.keep = rec.claim.completedWith() == 0
		if rec.keep {
			rec.sent = rec.Header().Clone()
		}
	}
	rec.ResponseWriter.WriteHeader(code)
}

func (rec *recorder) Write(b []byte) (int, error) {
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	if rec.keep && !rec.overflow {
		if rec.body.Len()+len(b) > rec.max {
			rec.overflow = true
			rec.body = bytes.Buffer{}
		} else {
			rec.body.Write(b)
		}
	}
	return rec.ResponseWriter.Write(b)
}

// Unwrap returns the ResponseWriter underneath, for http.ResponseController.
func (rec *recorder) Unwrap() http.ResponseWriter { return rec.ResponseWriter }

// Flush sends what was written so far, when the ResponseWriter underneath
// can.
func (rec *recorder) Flush() {
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	_ = http.NewResponseController(rec.ResponseWriter).Flush()
}

// Problem writes an RFC 9457 problem document (application/problem+json)
// with status and detail: the default of Config.Error.
func Problem(w http.ResponseWriter, _ *http.Request, status int, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"type": "about:blank", "title": http.StatusText(status), "status": status, "detail": detail,
	})
}

// readRequest reads r's body (at most MaxBodyBytes; r.Body is replaced by
// a copy for the handler) and returns the Request of key: its fingerprint
// and scope. On a body it cannot read it answers the error itself and
// returns false.
func (k *Keys[TTx]) readRequest(w http.ResponseWriter, r *http.Request, key string) (Request, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, k.cfg.MaxBodyBytes))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		k.cfg.Error(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than %d bytes, the most this API reads", tooLarge.Limit))
		return Request{}, false
	}
	if err != nil {
		k.cfg.Error(w, r, http.StatusBadRequest, "cannot read the body: "+err.Error())
		return Request{}, false
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	req := Request{Key: key, Fingerprint: k.cfg.Fingerprint(r, body)}
	if k.cfg.Scope != nil {
		req.Scope = k.cfg.Scope(r)
	}
	return req, true
}

// answerUnclaimed answers a request whose key this request did not claim
// (a replay, a request in progress, a key used with another request) and
// reports whether it did; for Claimed it does nothing.
func (k *Keys[TTx]) answerUnclaimed(w http.ResponseWriter, r *http.Request, c *Claim) bool {
	switch c.Outcome {
	case Replay:
		c.Response.Header.Set(HeaderReplayed, "true")
		c.Response.Send(w)
	case InProgress:
		w.Header().Set("Retry-After", "1")
		k.cfg.Error(w, r, http.StatusConflict, "a request with this "+HeaderKey+" is still being processed; retry later with the same key")
	case Mismatch:
		k.cfg.Error(w, r, http.StatusUnprocessableEntity, "this "+HeaderKey+" was already used with another request: a retry must repeat the request exactly (method, path and the same body bytes); use a new key for a new request")
	default:
		return false
	}
	return true
}
