package postgres

import (
	"context"
	"strings"
	"time"

	"github.com/idem-go/idem/driver"
)

var _ driver.IdempotencyKeyLocker = (*dialect)(nil)

// idempotencyQueries are the statements on the idempotency key table
// (migration 0004).
type idempotencyQueries struct {
	insert, get, reclaim, complete, release, purge, tryLock, tryLockInsert string
}

// newIdempotencyQueries renders the statements on table, quoted and
// qualified.
func newIdempotencyQueries(table string) idempotencyQueries {
	lockTable := `'` + strings.ReplaceAll(table, "'", "''") + `'::regclass::oid::text`
	return idempotencyQueries{
		insert: `INSERT INTO ` + table + ` (scope, idem_key, fingerprint, state, owner, locked_until, expires_at, created_at)
VALUES ($1, $2, $3, 'processing', $4, $5, $6, $7)
ON CONFLICT (scope, idem_key) DO NOTHING`,
		get: `SELECT fingerprint, state = 'done', owner, COALESCE(response_status, 0), COALESCE(response_headers, ''),
       response_body, locked_until, expires_at, created_at, completed_at
FROM ` + table + ` WHERE scope = $1 AND idem_key = $2`,
		reclaim: `UPDATE ` + table + ` SET fingerprint = $3, state = 'processing', owner = $4, response_status = NULL,
    response_headers = NULL, response_body = NULL, locked_until = $5, expires_at = $6, created_at = $7, completed_at = NULL
WHERE scope = $1 AND idem_key = $2 AND owner = $8
  AND (expires_at <= $7 OR (state = 'processing' AND locked_until <= $7))`,
		complete: `UPDATE ` + table + ` SET state = 'done', response_status = $4, response_headers = $5, response_body = $6, completed_at = $7
WHERE scope = $1 AND idem_key = $2 AND owner = $3 AND state = 'processing'`,
		release: `DELETE FROM ` + table + ` WHERE scope = $1 AND idem_key = $2 AND owner = $3 AND state = 'processing'`,
		purge: `DELETE FROM ` + table + ` WHERE (scope, idem_key) IN (
    SELECT scope, idem_key FROM ` + table + ` WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2)`,
		// The two-integer form, class 7195: a space of its own, apart from
		// the relay's claim locks (class 7193), its waiting lock (class
		// 7194) and the migrations' lock (one bigint). The table's oid is
		// in the hash, so that the keys of two tables seldom meet, even
		// when both are named without a schema (found by search_path).
		tryLock: `SELECT pg_try_advisory_xact_lock(7195, hashtext(` + lockTable + ` || chr(10) || $1::text || chr(10) || $2::text))`,
		// The lock, then the insert only if it was taken. The CTE l runs
		// once (a volatile function is never inlined), before the insert
		// reads it. ON CONFLICT sees a key committed after the statement's
		// snapshot (read committed), so a holder that committed just
		// before the lock was taken is never missed.
		tryLockInsert: `WITH l AS (
    SELECT pg_try_advisory_xact_lock(7195, hashtext(` + lockTable + ` || chr(10) || $1::text || chr(10) || $2::text)) AS ok
), ins AS (
    INSERT INTO ` + table + ` (scope, idem_key, fingerprint, state, owner, locked_until, expires_at, created_at)
    SELECT $1, $2, $3, 'processing', $4, $5, $6, $7 FROM l WHERE l.ok
    ON CONFLICT (scope, idem_key) DO NOTHING
    RETURNING 1
)
SELECT (SELECT ok FROM l), EXISTS (SELECT 1 FROM ins)`,
	}
}

// InsertIdempotencyKey implements driver.IdempotencyKeys.
func (d *dialect) InsertIdempotencyKey(ctx context.Context, ex driver.Executor, p driver.IdempotencyKeyClaimParams) (bool, error) {
	n, err := ex.Exec(ctx, d.keys.insert, p.Scope, p.Key, p.Fingerprint, p.Owner, p.LockedUntil, p.ExpiresAt, p.Now)
	return n == 1, d.Wrap(err)
}

// GetIdempotencyKey implements driver.IdempotencyKeys.
func (d *dialect) GetIdempotencyKey(ctx context.Context, ex driver.Executor, ref driver.IdempotencyKeyRef) (driver.IdempotencyKey, error) {
	k := driver.IdempotencyKey{IdempotencyKeyRef: ref}
	var completedAt *time.Time
	err := driver.QueryRow(ctx, ex, d.keys.get, []any{ref.Scope, ref.Key},
		&k.Fingerprint, &k.Completed, &k.Owner, &k.Status, &k.Headers, &k.Body, &k.LockedUntil, &k.ExpiresAt, &k.CreatedAt, &completedAt)
	if err != nil {
		return driver.IdempotencyKey{}, d.Wrap(err)
	}
	if completedAt != nil {
		k.CompletedAt = completedAt.UTC()
	}
	k.LockedUntil, k.ExpiresAt, k.CreatedAt = k.LockedUntil.UTC(), k.ExpiresAt.UTC(), k.CreatedAt.UTC()
	return k, nil
}

// ReclaimIdempotencyKey implements driver.IdempotencyKeys.
func (d *dialect) ReclaimIdempotencyKey(ctx context.Context, ex driver.Executor, p driver.IdempotencyKeyClaimParams) (bool, error) {
	n, err := ex.Exec(ctx, d.keys.reclaim, p.Scope, p.Key, p.Fingerprint, p.Owner, p.LockedUntil, p.ExpiresAt, p.Now, p.PreviousOwner)
	return n == 1, d.Wrap(err)
}

// CompleteIdempotencyKey implements driver.IdempotencyKeys.
func (d *dialect) CompleteIdempotencyKey(ctx context.Context, ex driver.Executor, p driver.IdempotencyKeyCompleteParams) (bool, error) {
	body := p.Body
	if body == nil {
		body = []byte{} // an empty body, not an unknown one
	}
	n, err := ex.Exec(ctx, d.keys.complete, p.Scope, p.Key, p.Owner, p.Status, p.Headers, body, p.Now)
	return n == 1, d.Wrap(err)
}

// ReleaseIdempotencyKey implements driver.IdempotencyKeys.
func (d *dialect) ReleaseIdempotencyKey(ctx context.Context, ex driver.Executor, ref driver.IdempotencyKeyRef, owner string) (bool, error) {
	n, err := ex.Exec(ctx, d.keys.release, ref.Scope, ref.Key, owner)
	return n == 1, d.Wrap(err)
}

// PurgeIdempotencyKeys implements driver.IdempotencyKeys.
func (d *dialect) PurgeIdempotencyKeys(ctx context.Context, ex driver.Executor, p driver.IdempotencyKeyPurgeParams) (int64, error) {
	n, err := ex.Exec(ctx, d.keys.purge, p.Before, p.Limit)
	return n, d.Wrap(err)
}

// TryLockIdempotencyKey implements driver.IdempotencyKeyLocker.
func (d *dialect) TryLockIdempotencyKey(ctx context.Context, ex driver.Executor, ref driver.IdempotencyKeyRef) (bool, error) {
	var ok bool
	err := driver.QueryRow(ctx, ex, d.keys.tryLock, []any{ref.Scope, ref.Key}, &ok)
	return ok, d.Wrap(err)
}

// TryLockInsertIdempotencyKey implements driver.IdempotencyKeyLocker.
func (d *dialect) TryLockInsertIdempotencyKey(ctx context.Context, ex driver.Executor, p driver.IdempotencyKeyClaimParams) (locked, inserted bool, err error) {
	err = driver.QueryRow(ctx, ex, d.keys.tryLockInsert,
		[]any{p.Scope, p.Key, p.Fingerprint, p.Owner, p.LockedUntil, p.ExpiresAt, p.Now}, &locked, &inserted)
	return locked, inserted, d.Wrap(err)
}
