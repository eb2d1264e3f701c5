package driver

import (
	"context"
	"time"
)

// IdempotencyKeys is the part of a Dialect that stores the idempotency keys
// of incoming requests (package idempotency), each claimed by one request
// at a time, then completed with the response to replay. The conformance
// suite (drivertest.IdempotencyKeys) checks it.
//
// Every method runs on the executor it is given: the pool for a claim
// committed at once, the application's transaction for a completion that
// commits with the business rows. Times are the caller's clock, truncated
// to microseconds; a key is identified by its scope and key (see
// IdempotencyKeyRef).
type IdempotencyKeys interface {
	// InsertIdempotencyKey inserts a key being processed, owned by
	// p.Owner, and reports whether it did; false, with no error, when
	// the scope already holds the key. Only the conflict on the key
	// counts as "already there"; any other error is returned.
	InsertIdempotencyKey(ctx context.Context, ex Executor, p IdempotencyKeyClaimParams) (inserted bool, err error)
	// GetIdempotencyKey returns a stored key, or idem.ErrNotFound.
	GetIdempotencyKey(ctx context.Context, ex Executor, ref IdempotencyKeyRef) (IdempotencyKey, error)
	// ReclaimIdempotencyKey makes a stored key processing again for a new
	// owner, with a new fingerprint, lock and expiry and no response, if
	// it is still owned by p.PreviousOwner and either expired
	// (ExpiresAt <= p.Now) or processing with its lock expired
	// (LockedUntil <= p.Now). It reports whether it did.
	ReclaimIdempotencyKey(ctx context.Context, ex Executor, p IdempotencyKeyClaimParams) (reclaimed bool, err error)
	// CompleteIdempotencyKey stores the response of a processing key still
	// owned by p.Owner and marks it completed. It reports false when the
	// key is no longer processing for that owner (taken over after its
	// lock expired, or purged).
	CompleteIdempotencyKey(ctx context.Context, ex Executor, p IdempotencyKeyCompleteParams) (completed bool, err error)
	// ReleaseIdempotencyKey deletes a key still processing for owner, so
	// that a retry runs at once, and reports whether it did. A completed
	// key, or one another owner took over, stays.
	ReleaseIdempotencyKey(ctx context.Context, ex Executor, ref IdempotencyKeyRef, owner string) (released bool, err error)
	// PurgeIdempotencyKeys deletes at most p.Limit keys whose ExpiresAt is
	// at or before p.Before, completed or not, and returns how many.
	PurgeIdempotencyKeys(ctx context.Context, ex Executor, p IdempotencyKeyPurgeParams) (int64, error)
}

// IdempotencyKeyRef identifies a stored key.
type IdempotencyKeyRef struct {
	// Scope is who the key belongs to (an account, a client), or "" when
	// keys are shared by every client. Keys of different scopes never
	// meet.
	Scope string
	// Key is the client's idempotency key.
	Key string
}

// IdempotencyKeyClaimParams are the arguments of InsertIdempotencyKey and
// ReclaimIdempotencyKey.
type IdempotencyKeyClaimParams struct {
	IdempotencyKeyRef
	// Fingerprint identifies the request the key is used with.
	Fingerprint string
	// Owner is a token unique to the claim, which only its completion or
	// release may name.
	Owner string
	// PreviousOwner is the owner the caller read on the key it reclaims
	// (ReclaimIdempotencyKey only): a key changed meanwhile is left alone.
	PreviousOwner string
	// Now is the claim's time: CreatedAt, and for a reclaim the time the
	// lock and expiry are compared with.
	Now time.Time
	// LockedUntil is when a retry may take the key over if the request
	// has not completed it.
	LockedUntil time.Time
	// ExpiresAt is when the key is forgotten.
	ExpiresAt time.Time
}

// IdempotencyKeyCompleteParams are the arguments of CompleteIdempotencyKey.
type IdempotencyKeyCompleteParams struct {
	IdempotencyKeyRef
	// Owner is the claim's owner token.
	Owner string
	// Status is the response's status code.
	Status int
	// Headers are the response's header fields to replay, as a JSON
	// object of string arrays, stored as it is.
	Headers string
	// Body is the response's body, stored byte for byte.
	Body []byte
	// Now is the completion's time.
	Now time.Time
}

// IdempotencyKeyPurgeParams are the arguments of PurgeIdempotencyKeys.
type IdempotencyKeyPurgeParams struct {
	// Before: keys that expire at or before it are deleted.
	Before time.Time
	// Limit is the most keys deleted by one call; positive.
	Limit int
}

// IdempotencyKey is a stored idempotency key.
type IdempotencyKey struct {
	IdempotencyKeyRef
	// Fingerprint identifies the request the key was used with.
	Fingerprint string
	// Owner is the token of the claim that holds (or held) the key.
	Owner string
	// Completed reports whether the response is stored; false while the
	// request is processing.
	Completed bool
	// Status, Headers and Body are the stored response, when Completed.
	Status  int
	Headers string
	Body    []byte
	// LockedUntil is when a retry may take a processing key over.
	LockedUntil time.Time
	// ExpiresAt is when the key is forgotten.
	ExpiresAt time.Time
	// CreatedAt is when the key was claimed (or last reclaimed).
	CreatedAt time.Time
	// CompletedAt is when the response was stored; zero while processing.
	CompletedAt time.Time
}

// IdempotencyKeyLocker is an optional ability of a Dialect, which package
// idempotency tests for: a lock on one key held until the end of the
// transaction that takes it, so that a request holding its key in its own
// transaction (idempotency.Keys.ClaimTx) makes a concurrent request with
// the same key wait, then find the completed key. PostgreSQL has it (a
// transaction advisory lock on a hash of the table, scope and key: two keys
// with the same hash only wait for each other). A dialect without it relies
// on its own locks: MySQL/MariaDB's insert of the key waits on the row a
// concurrent transaction inserted, SQLite's immediate transactions hold the
// database's write lock.
type IdempotencyKeyLocker interface {
	// TryLockIdempotencyKey takes the lock of ref for the transaction ex
	// and reports whether it did: false, at once, when another
	// transaction holds it.
	TryLockIdempotencyKey(ctx context.Context, ex Executor, ref IdempotencyKeyRef) (bool, error)
	// TryLockInsertIdempotencyKey is TryLockIdempotencyKey, then, when
	// the lock was taken, InsertIdempotencyKey, in one round trip: the
	// first step of a request's claim in its own transaction. inserted is
	// false when the lock was not taken or the key exists.
	TryLockInsertIdempotencyKey(ctx context.Context, ex Executor, p IdempotencyKeyClaimParams) (locked, inserted bool, err error)
}
