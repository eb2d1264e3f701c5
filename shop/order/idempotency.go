package order

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem/shop/store"
)

// Idempotency-Key defaults.
const (
	// KeyTTLDefault is how long an Idempotency-Key is remembered: a request
	// repeated within it with the same key and body gets the first response;
	// after it, the key is forgotten and may be used again.
	KeyTTLDefault = 24 * time.Hour
	// KeyLockTimeoutDefault is how long a request holds its key while it
	// runs. A retry meanwhile gets 409 Conflict. A request that crashed
	// leaves its key locked until then; a retry after it takes the key over.
	KeyLockTimeoutDefault = 10 * time.Second
	// KeyPurgeIntervalDefault is how often expired keys are deleted.
	KeyPurgeIntervalDefault = 10 * time.Minute
	// MaxKeyLength is the longest Idempotency-Key accepted.
	MaxKeyLength = 255
)

type claimKind int

const (
	claimNew      claimKind = iota + 1 // the request owns the key: run it
	claimReplay                        // done before: replay the stored response
	claimBusy                          // another request with the key is running: 409
	claimMismatch                      // the key was used with another body: 422
)

// claim is the result of beginning a request with an Idempotency-Key.
type claim struct {
	kind   claimKind
	key    string
	owner  string
	status int
	body   string
}

// keyStore implements the Idempotency-Key header as the IETF httpapi draft
// describes it. A request first records its key as "processing" in a
// transaction of its own, committed at once, so concurrent retries see it;
// then the order, its outbox event and the key's completion (the response
// to replay) commit together in the order transaction. A crash before that
// commit leaves only the processing key, which a retry takes over once
// lockTimeout has passed.
type keyStore struct {
	db          *store.DB
	ttl         time.Duration
	lockTimeout time.Duration
	now         func() time.Time
}

func requestHash(method, path string, body []byte) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s %s\n", method, path)
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// begin claims key for a request whose fingerprint is hash.
func (s *keyStore) begin(ctx context.Context, key, hash string) (claim, error) {
	owner := uuid.NewString()
	for range 3 {
		now := s.now().UTC()
		n, err := exec(ctx, s.db.SQL, s.db.Q(qKeyInsert), key, hash, owner, now.Add(s.lockTimeout), now.Add(s.ttl), now)
		if err != nil {
			return claim{}, err
		}
		if n == 1 {
			return claim{kind: claimNew, key: key, owner: owner}, nil
		}
		var (
			storedHash, state, body string
			status                  int
			lockedUntil, expiresAt  time.Time
		)
		err = s.db.SQL.QueryRowContext(ctx, s.db.Q(qKeyGet), key).Scan(&storedHash, &state, &status, &body, &lockedUntil, &expiresAt)
		if errors.Is(err, sql.ErrNoRows) {
			continue // released or purged meanwhile: insert again
		}
		if err != nil {
			return claim{}, err
		}
		if !expiresAt.After(now) {
			// Expired: the key is forgotten and starts a new request.
			n, err := exec(ctx, s.db.SQL, s.db.Q(qKeyRestart), hash, owner, now.Add(s.lockTimeout), now.Add(s.ttl), now, key, now)
			if err != nil {
				return claim{}, err
			}
			if n == 1 {
				return claim{kind: claimNew, key: key, owner: owner}, nil
			}
			continue
		}
		if storedHash != hash {
			return claim{kind: claimMismatch, key: key}, nil
		}
		if state == "done" {
			return claim{kind: claimReplay, key: key, status: status, body: body}, nil
		}
		if lockedUntil.After(now) {
			return claim{kind: claimBusy, key: key}, nil
		}
		// The request that held the key is gone (it crashed before its
		// commit, or took longer than the lock timeout): take it over. Its
		// own completion, if it ever comes, fails on the owner check.
		n, err = exec(ctx, s.db.SQL, s.db.Q(qKeyTakeOver), owner, now.Add(s.lockTimeout), key, now)
		if err != nil {
			return claim{}, err
		}
		if n == 1 {
			return claim{kind: claimNew, key: key, owner: owner}, nil
		}
		return claim{kind: claimBusy, key: key}, nil
	}
	return claim{kind: claimBusy, key: key}, nil
}

// errKeyLost is returned when a request's key was taken over before it could
// complete: its transaction is rolled back and the client is told to retry.
var errKeyLost = errors.New("idempotency key taken over by a retry")

// complete stores the response of the claim's request in tx, the order's
// transaction.
func (s *keyStore) complete(ctx context.Context, tx *sql.Tx, c claim, status int, body []byte) error {
	n, err := exec(ctx, tx, s.db.Q(qKeyComplete), status, string(body), c.key, c.owner)
	if err != nil {
		return err
	}
	if n != 1 {
		return errKeyLost
	}
	return nil
}

// release forgets the key of a request that failed without effect, so that a
// retry runs at once.
func (s *keyStore) release(ctx context.Context, c claim) {
	_, _ = exec(context.WithoutCancel(ctx), s.db.SQL, s.db.Q(qKeyRelease), c.key, c.owner)
}

// purge deletes expired keys.
func (s *keyStore) purge(ctx context.Context) (int64, error) {
	return exec(ctx, s.db.SQL, s.db.Q(qKeyPurge), s.now().UTC())
}

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

func exec(ctx context.Context, ex execer, query string, args ...any) (int64, error) {
	res, err := ex.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
