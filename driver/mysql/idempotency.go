package mysql

import (
	"context"
	"sync"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/sqltime"
)

var _ driver.IdempotencyKeys = (*Dialect)(nil)

// idempotencyQueries are the statements on the idempotency key table
// (migration 0004), rendered once per qualified table name.
type idempotencyQueries struct {
	insert, get, reclaim, complete, release, purge string
}

var idempotencyQueryCache sync.Map // qualified table name -> *idempotencyQueries

func (d *Dialect) idempotencyQueries() *idempotencyQueries {
	table := d.qualify(d.tables.IdempotentRequest)
	if q, ok := idempotencyQueryCache.Load(table); ok {
		return q.(*idempotencyQueries)
	}
	q := &idempotencyQueries{
		// A plain insert: the duplicate-key error on the primary key is the
		// conflict (INSERT IGNORE would also hide every other error).
		insert: `INSERT INTO ` + table + ` (scope, idem_key, fingerprint, state, owner, locked_until, expires_at, created_at)
VALUES (?, ?, ?, 'processing', ?, ?, ?, ?)`,
		get: `SELECT fingerprint, state = 'done', owner, COALESCE(response_status, 0), COALESCE(response_headers, ''),
       response_body, locked_until, expires_at, created_at, completed_at
FROM ` + table + ` WHERE scope = ? AND idem_key = ?`,
		reclaim: `UPDATE ` + table + ` SET fingerprint = ?, state = 'processing', owner = ?, response_status = NULL,
    response_headers = NULL, response_body = NULL, locked_until = ?, expires_at = ?, created_at = ?, completed_at = NULL
WHERE scope = ? AND idem_key = ? AND owner = ?
  AND (expires_at <= ? OR (state = 'processing' AND locked_until <= ?))`,
		complete: `UPDATE ` + table + ` SET state = 'done', response_status = ?, response_headers = ?, response_body = ?, completed_at = ?
WHERE scope = ? AND idem_key = ? AND owner = ? AND state = 'processing'`,
		release: `DELETE FROM ` + table + ` WHERE scope = ? AND idem_key = ? AND owner = ? AND state = 'processing'`,
		purge:   `DELETE FROM ` + table + ` WHERE expires_at <= ? ORDER BY expires_at LIMIT ?`,
	}
	actual, _ := idempotencyQueryCache.LoadOrStore(table, q)
	return actual.(*idempotencyQueries)
}

// InsertIdempotencyKey implements driver.IdempotencyKeys.
func (d *Dialect) InsertIdempotencyKey(ctx context.Context, ex driver.Executor, p driver.IdempotencyKeyClaimParams) (bool, error) {
	n, err := ex.Exec(ctx, d.idempotencyQueries().insert, p.Scope, p.Key, p.Fingerprint, p.Owner,
		sqltime.Format(p.LockedUntil), sqltime.Format(p.ExpiresAt), sqltime.Format(p.Now))
	if IsDuplicateKey(err, d.tables.IdempotentRequest, "PRIMARY") {
		return false, nil
	}
	return n == 1, d.wrap(err)
}

// GetIdempotencyKey implements driver.IdempotencyKeys.
func (d *Dialect) GetIdempotencyKey(ctx context.Context, ex driver.Executor, ref driver.IdempotencyKeyRef) (driver.IdempotencyKey, error) {
	k := driver.IdempotencyKey{IdempotencyKeyRef: ref}
	var completed int
	err := driver.QueryRow(ctx, ex, d.idempotencyQueries().get, []any{ref.Scope, ref.Key},
		&k.Fingerprint, &completed, &k.Owner, &k.Status, &k.Headers, &k.Body,
		sqltime.Scanner(&k.LockedUntil), sqltime.Scanner(&k.ExpiresAt), sqltime.Scanner(&k.CreatedAt), sqltime.Scanner(&k.CompletedAt))
	if err != nil {
		return driver.IdempotencyKey{}, d.wrap(err)
	}
	k.Completed = completed == 1
	return k, nil
}

// ReclaimIdempotencyKey implements driver.IdempotencyKeys.
func (d *Dialect) ReclaimIdempotencyKey(ctx context.Context, ex driver.Executor, p driver.IdempotencyKeyClaimParams) (bool, error) {
	now := sqltime.Format(p.Now)
	n, err := ex.Exec(ctx, d.idempotencyQueries().reclaim, p.Fingerprint, p.Owner,
		sqltime.Format(p.LockedUntil), sqltime.Format(p.ExpiresAt), now,
		p.Scope, p.Key, p.PreviousOwner, now, now)
	return n == 1, d.wrap(err)
}

// CompleteIdempotencyKey implements driver.IdempotencyKeys.
func (d *Dialect) CompleteIdempotencyKey(ctx context.Context, ex driver.Executor, p driver.IdempotencyKeyCompleteParams) (bool, error) {
	body := p.Body
	if body == nil {
		body = []byte{} // an empty body, not an unknown one
	}
	n, err := ex.Exec(ctx, d.idempotencyQueries().complete, p.Status, p.Headers, body, sqltime.Format(p.Now),
		p.Scope, p.Key, p.Owner)
	return n == 1, d.wrap(err)
}

// ReleaseIdempotencyKey implements driver.IdempotencyKeys.
func (d *Dialect) ReleaseIdempotencyKey(ctx context.Context, ex driver.Executor, ref driver.IdempotencyKeyRef, owner string) (bool, error) {
	n, err := ex.Exec(ctx, d.idempotencyQueries().release, ref.Scope, ref.Key, owner)
	return n == 1, d.wrap(err)
}

// PurgeIdempotencyKeys implements driver.IdempotencyKeys.
func (d *Dialect) PurgeIdempotencyKeys(ctx context.Context, ex driver.Executor, p driver.IdempotencyKeyPurgeParams) (int64, error) {
	n, err := ex.Exec(ctx, d.idempotencyQueries().purge, sqltime.Format(p.Before), p.Limit)
	return n, d.wrap(err)
}
