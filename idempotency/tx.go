package idempotency

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem/driver"
)

// ClaimTx claims req's key inside tx, the transaction of the request's
// work: the claim, the business rows, the outbox events and the response
// (Complete, in the same tx) commit together, in one transaction, or not
// at all. Call it first in the transaction, before any read.
//
// The key is locked until tx ends: on PostgreSQL by a transaction advisory
// lock on a hash of the key, on MySQL/MariaDB by the row its insert
// writes, on SQLite by the database's write lock (the idem SQLite driver's
// transactions are immediate). A concurrent request with the same key
// waits, up to Config.LockWait, then finds the response to replay (the
// first committed), or the key free (it rolled back) and runs. After
// Config.LockWait the outcome is InProgress. A crash rolls the claim back
// with the work: there is nothing to take over and nothing to release.
//
// The outcomes are Claim's. With Claimed, run the request in tx, Complete
// the key in tx with its response, and commit; to answer an error, roll tx
// back. With any other outcome tx holds nothing of the request: roll it
// back and answer (see Outcome).
func (k *Keys[TTx]) ClaimTx(ctx context.Context, tx TTx, req Request) (*Claim, error) {
	if err := validateRequest(req); err != nil {
		return nil, err
	}
	ex := k.drv.Tx(tx)
	if locker, ok := k.store.(driver.IdempotencyKeyLocker); ok {
		// The common case, a new key, in one round trip.
		owner, now := uuid.NewString(), k.now()
		p := driver.IdempotencyKeyClaimParams{
			IdempotencyKeyRef: driver.IdempotencyKeyRef{Scope: req.Scope, Key: req.Key}, Fingerprint: req.Fingerprint,
			Owner: owner, Now: now, LockedUntil: now.Add(k.cfg.LockTimeout), ExpiresAt: now.Add(k.cfg.TTL),
		}
		locked, inserted, err := locker.TryLockInsertIdempotencyKey(ctx, ex, p)
		if err != nil {
			return nil, fmt.Errorf("idem: idempotency: claim key: %w", err)
		}
		if inserted {
			return &Claim{Request: req, Outcome: Claimed, owner: owner, LockedUntil: p.LockedUntil}, nil
		}
		if !locked {
			if locked, err = k.lock(ctx, locker, ex, p.IdempotencyKeyRef); err != nil {
				return nil, err
			}
			if !locked {
				return &Claim{Request: req, Outcome: InProgress, LockedUntil: k.now().Add(time.Second)}, nil
			}
		}
	}
	return k.claim(ctx, ex, req)
}

// lock takes ref's lock for the transaction of ex, waiting up to
// Config.LockWait while another transaction holds it.
func (k *Keys[TTx]) lock(ctx context.Context, locker driver.IdempotencyKeyLocker, ex driver.Executor, ref driver.IdempotencyKeyRef) (bool, error) {
	deadline := time.Now().Add(k.cfg.LockWait)
	pause := 2 * time.Millisecond
	for {
		ok, err := locker.TryLockIdempotencyKey(ctx, ex, ref)
		if err != nil {
			return false, fmt.Errorf("idem: idempotency: lock key: %w", err)
		}
		if ok {
			return true, nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false, nil
		}
		t := time.NewTimer(min(pause, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return false, ctx.Err()
		case <-t.C:
		}
		pause = min(2*pause, 100*time.Millisecond)
	}
}

// TxHandlerFunc handles a request in tx, the transaction that holds its
// Idempotency-Key (see Keys.TxHandler), and returns the response to send.
// It must not write to the client itself. A 2xx response is stored with
// the key and committed with tx; any other response is sent after tx is
// rolled back, so that the request leaves nothing and a retry runs again.
// An error rolls tx back and is answered 500 (503 with Retry-After when
// the database said it is transient). Header fields that must not be
// replayed (Set-Cookie) are sent but never stored.
type TxHandlerFunc[TTx any] func(ctx context.Context, tx TTx, r *http.Request) (Response, error)

// TxHandler returns an HTTP handler that runs fn in one transaction with
// the request's Idempotency-Key: the key's claim, fn's rows and outbox
// events, and the response to replay commit together (see ClaimTx), one
// commit per request where Middleware costs three (the claim, the work,
// then the completion of a handler that does not complete its key). Use
// it for handlers whose effects are all in this database; Middleware
// stays for handlers that cannot share a transaction.
//
// The answers are the middleware's: 400 for an unusable key (or a missing
// one with Config.Required), 413 beyond Config.MaxBodyBytes, the stored
// response with Idempotent-Replayed: true for a retry, 422 for another
// request with the key, and 409 with Retry-After: 1 when a request with
// the key still runs after Config.LockWait (a retry meanwhile waits for
// it, then is answered its response). A request without a key runs fn in
// a transaction of its own, committed for a 2xx response. A panic in fn
// rolls back.
func (k *Keys[TTx]) TxHandler(fn TxHandlerFunc[TTx]) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req *Request
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		default:
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
				break
			}
			rq, ok := k.readRequest(w, r, key)
			if !ok {
				return
			}
			req = &rq
		}
		k.serveTx(w, r, req, fn)
	})
}

func (k *Keys[TTx]) serveTx(w http.ResponseWriter, r *http.Request, req *Request, fn TxHandlerFunc[TTx]) {
	ctx := r.Context()
	rollback := func() {} // set once the transaction has begun
	fail := func(what string, err error) {
		rollback() // before the answer, so that the key is not held while it is sent
		k.errs.Error(ctx, what, err)
		if k.drv.Dialect().IsTransient(err) {
			w.Header().Set("Retry-After", "1")
			k.cfg.Error(w, r, http.StatusServiceUnavailable, "the database is not available now; retry the request"+withSameKey(req))
			return
		}
		k.cfg.Error(w, r, http.StatusInternalServerError, "internal error; the request may be retried"+withSameKey(req))
	}
	tx, err := k.drv.Begin(ctx)
	if err != nil {
		fail("transaction not begun", err)
		return
	}
	done := false
	rollback = func() {
		if !done {
			done = true
			_ = k.drv.Rollback(context.WithoutCancel(ctx), tx)
		}
	}
	defer rollback() // an error, or a panic
	var c *Claim
	if req != nil {
		c, err = k.ClaimTx(ctx, tx, *req)
		if err != nil {
			fail("idempotency key not claimed", err)
			return
		}
		if c.Outcome != Claimed {
			rollback() // before the answer, so that the key is not held while it is sent
		}
		if k.answerUnclaimed(w, r, c) {
			k.errs.OK(ctx)
			return
		}
	}
	resp, err := fn(ctx, tx, r)
	if err != nil {
		fail("request failed", err)
		return
	}
	if resp.Header == nil {
		resp.Header = http.Header{}
	}
	if resp.Status < 200 || resp.Status > 299 {
		rollback() // before the answer: a retry finds the key free
		k.errs.OK(ctx)
		resp.Send(w)
		return
	}
	if err := k.Complete(ctx, tx, c, resp); err != nil {
		if errors.Is(err, ErrClaimLost) { // a Claim of another server's middleware took it over
			w.Header().Set("Retry-After", "1")
			k.cfg.Error(w, r, http.StatusConflict, "a retry with this "+HeaderKey+" took over this request; retry later with the same key")
			return
		}
		fail("idempotency key not completed", err)
		return
	}
	done = true
	if err := k.drv.Commit(ctx, tx); err != nil {
		fail("request not committed", err)
		return
	}
	k.errs.OK(ctx)
	resp.Send(w)
}

func withSameKey(req *Request) string {
	if req == nil {
		return ""
	}
	return " with the same " + HeaderKey
}
