package sqlbase

import (
	"context"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/sqltime"
)

// InsertIdempotencyKey implements driver.IdempotencyKeys.
func (d *Dialect) InsertIdempotencyKey(ctx context.Context, ex driver.Executor, p driver.IdempotencyKeyClaimParams) (bool, error) {
	n, err := ex.Exec(ctx, d.q.keyInsert, p.Scope, p.Key, p.Fingerprint, p.Owner,
		sqltime.Format(p.LockedUntil), sqltime.Format(p.ExpiresAt), sqltime.Format(p.Now))
	if d.f.IsKeyConflict != nil && d.f.IsKeyConflict(err, d.Tables().IdempotentRequest) {
		return false, nil
	}
	return n == 1, d.Wrap(err)
}

// GetIdempotencyKey implements driver.IdempotencyKeys.
func (d *Dialect) GetIdempotencyKey(ctx context.Context, ex driver.Executor, ref driver.IdempotencyKeyRef) (driver.IdempotencyKey, error) {
	k := driver.IdempotencyKey{IdempotencyKeyRef: ref}
	var completed int
	err := driver.QueryRow(ctx, ex, d.q.keyGet, []any{ref.Scope, ref.Key},
		&k.Fingerprint, &completed, &k.Owner, &k.Status, &k.Headers, &k.Body,
		TimeDest(&k.LockedUntil), TimeDest(&k.ExpiresAt), TimeDest(&k.CreatedAt), TimeDest(&k.CompletedAt))
	if err != nil {
		return driver.IdempotencyKey{}, d.Wrap(err)
	}
	k.Completed = completed == 1
	return k, nil
}

// ReclaimIdempotencyKey implements driver.IdempotencyKeys.
func (d *Dialect) ReclaimIdempotencyKey(ctx context.Context, ex driver.Executor, p driver.IdempotencyKeyClaimParams) (bool, error) {
	now := sqltime.Format(p.Now)
	n, err := ex.Exec(ctx, d.q.keyReclaim, p.Fingerprint, p.Owner,
		sqltime.Format(p.LockedUntil), sqltime.Format(p.ExpiresAt), now,
		p.Scope, p.Key, p.PreviousOwner, now, now)
	return n == 1, d.Wrap(err)
}

// CompleteIdempotencyKey implements driver.IdempotencyKeys.
func (d *Dialect) CompleteIdempotencyKey(ctx context.Context, ex driver.Executor, p driver.IdempotencyKeyCompleteParams) (bool, error) {
	body := p.Body
	if body == nil {
		body = []byte{} // an empty body, not an unknown one
	}
	n, err := ex.Exec(ctx, d.q.keyComplete, p.Status, p.Headers, body, sqltime.Format(p.Now), p.Scope, p.Key, p.Owner)
	return n == 1, d.Wrap(err)
}

// ReleaseIdempotencyKey implements driver.IdempotencyKeys.
func (d *Dialect) ReleaseIdempotencyKey(ctx context.Context, ex driver.Executor, ref driver.IdempotencyKeyRef, owner string) (bool, error) {
	n, err := ex.Exec(ctx, d.q.keyRelease, ref.Scope, ref.Key, owner)
	return n == 1, d.Wrap(err)
}

// PurgeIdempotencyKeys implements driver.IdempotencyKeys.
func (d *Dialect) PurgeIdempotencyKeys(ctx context.Context, ex driver.Executor, p driver.IdempotencyKeyPurgeParams) (int64, error) {
	n, err := ex.Exec(ctx, d.q.keyPurge, sqltime.Format(p.Before), p.Limit)
	return n, d.Wrap(err)
}
