package drivertest

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/testsvc"
)

// IdempotencyKeys checks the dialect's driver.IdempotencyKeys, the store of
// package idempotency: a key is claimed once per scope, whatever the
// number of concurrent claims; keys compare byte for byte (case, Unicode
// normalisation); a completion needs the claim's owner and a processing
// key, and commits or rolls back with its transaction; a response reads
// back byte for byte; a key is reclaimed only when expired or when its
// lock expired, and only from the owner the caller read; a release leaves
// completed and taken-over keys alone; the purge deletes expired keys only,
// at most its limit.
func IdempotencyKeys[TTx any](t *testing.T, setup Setup[TTx]) {
	now := time.Now().UTC().Truncate(time.Microsecond)
	claim := func(scope, key, owner string) driver.IdempotencyKeyClaimParams {
		return driver.IdempotencyKeyClaimParams{
			IdempotencyKeyRef: driver.IdempotencyKeyRef{Scope: scope, Key: key},
			Fingerprint:       "fp", Owner: owner, Now: now,
			LockedUntil: now.Add(10 * time.Second), ExpiresAt: now.Add(24 * time.Hour),
		}
	}

	t.Run("MissingTable", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{NoMigrate: true})
		_, err := db.Driver.Dialect().InsertIdempotencyKey(testsvc.Ctx(t, time.Minute), db.Driver.Pool(), claim("", "k", "o"))
		if !errors.Is(err, idem.ErrMissingTable) {
			t.Fatalf("insert without migrations: %v, want ErrMissingTable", err)
		}
	})

	t.Run("ClaimGetComplete", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		k := db.Driver.Dialect()
		ctx := testsvc.Ctx(t, time.Minute)
		pool := db.Driver.Pool()
		key := "clé"
		p := claim("", key, uuid.NewString())
		ok, err := k.InsertIdempotencyKey(ctx, pool, p)
		fatalIf(t, err, "insert")
		if !ok {
			t.Fatal("first insert of a key: not inserted")
		}
		again := p
		again.Owner, again.Fingerprint = uuid.NewString(), "other"
		ok, err = k.InsertIdempotencyKey(ctx, pool, again)
		fatalIf(t, err, "second insert")
		if ok {
			t.Fatal("second insert of a key: inserted, want the conflict reported as false")
		}
		got, err := k.GetIdempotencyKey(ctx, pool, p.IdempotencyKeyRef)
		fatalIf(t, err, "get")
		if got.Scope != "" || got.Key != key || got.Fingerprint != p.Fingerprint || got.Owner != p.Owner || got.Completed ||
			!got.LockedUntil.Equal(p.LockedUntil) || !got.ExpiresAt.Equal(p.ExpiresAt) || !got.CreatedAt.Equal(now) || !got.CompletedAt.IsZero() {
			t.Fatalf("get after insert: %+v, want the claim %+v", got, p)
		}
		if _, err := k.GetIdempotencyKey(ctx, pool, driver.IdempotencyKeyRef{Key: "absent"}); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("get of an absent key: %v, want ErrNotFound", err)
		}

		body := randomBytes(t, 1<<20)
		done := driver.IdempotencyKeyCompleteParams{IdempotencyKeyRef: p.IdempotencyKeyRef, Owner: "someone else",
			Status: 201, Headers: `{"Content-Type":["application/json"],"X":["` + strings.Repeat("v", 300) + `"]}`, Body: body, Now: now.Add(time.Second)}
		ok, err = k.CompleteIdempotencyKey(ctx, pool, done)
		fatalIf(t, err, "complete by another owner")
		if ok {
			t.Fatal("completed by an owner that does not hold the key")
		}
		// In a transaction rolled back: still processing.
		fatalIf(t, db.inTx(ctx, func(ex driver.Executor) error {
			done.Owner = p.Owner
			ok, err := k.CompleteIdempotencyKey(ctx, ex, done)
			if err == nil && !ok {
				t.Error("complete by the owner, in a transaction: not completed")
			}
			return err
		}), "complete in a transaction")
		if got, err := k.GetIdempotencyKey(ctx, pool, p.IdempotencyKeyRef); err != nil || got.Completed {
			t.Fatalf("after a rolled back completion: %+v %v, want still processing", got, err)
		}
		ok, err = k.CompleteIdempotencyKey(ctx, pool, done)
		fatalIf(t, err, "complete")
		if !ok {
			t.Fatal("complete by the owner: not completed")
		}
		got, err = k.GetIdempotencyKey(ctx, pool, p.IdempotencyKeyRef)
		fatalIf(t, err, "get after complete")
		if !got.Completed || got.Status != 201 || got.Headers != done.Headers || !bytes.Equal(got.Body, body) || !got.CompletedAt.Equal(done.Now) {
			t.Fatalf("after complete: completed=%v status=%d headers=%q body %d bytes (equal: %v) completed at %v, want the response of %v",
				got.Completed, got.Status, got.Headers, len(got.Body), bytes.Equal(got.Body, body), got.CompletedAt, done.Now)
		}
		ok, err = k.CompleteIdempotencyKey(ctx, pool, done)
		fatalIf(t, err, "second complete")
		if ok {
			t.Fatal("a completed key was completed again")
		}
		ok, err = k.ReleaseIdempotencyKey(ctx, pool, p.IdempotencyKeyRef, p.Owner)
		fatalIf(t, err, "release of a completed key")
		if ok {
			t.Fatal("a completed key was released")
		}

		// An empty response body is stored as empty.
		e := claim("", "empty", uuid.NewString())
		_, err = k.InsertIdempotencyKey(ctx, pool, e)
		fatalIf(t, err, "insert")
		_, err = k.CompleteIdempotencyKey(ctx, pool, driver.IdempotencyKeyCompleteParams{IdempotencyKeyRef: e.IdempotencyKeyRef, Owner: e.Owner, Status: 204, Now: now})
		fatalIf(t, err, "complete with no body")
		if got, err := k.GetIdempotencyKey(ctx, pool, e.IdempotencyKeyRef); err != nil || !got.Completed || got.Status != 204 || len(got.Body) != 0 || got.Headers != "" {
			t.Fatalf("completed with no body: %+v %v", got, err)
		}
	})

	t.Run("CommitsWithTheTransaction", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		k := db.Driver.Dialect()
		ctx := testsvc.Ctx(t, time.Minute)
		db.exec(t, reservationTable)
		p := claim("", "tx", uuid.NewString())
		_, err := k.InsertIdempotencyKey(ctx, db.Driver.Pool(), p)
		fatalIf(t, err, "insert")
		tx := db.begin(t, ctx)
		_, err = db.Driver.Tx(tx).Exec(ctx, db.bind(`INSERT INTO reservation (order_id, product_id, quantity) VALUES (?, ?, ?)`), "o-1", "p-1", 2)
		fatalIf(t, err, "business row")
		ok, err := k.CompleteIdempotencyKey(ctx, db.Driver.Tx(tx), driver.IdempotencyKeyCompleteParams{IdempotencyKeyRef: p.IdempotencyKeyRef, Owner: p.Owner, Status: 201, Body: []byte("{}"), Now: now})
		if err != nil || !ok {
			t.Fatalf("complete in the transaction: %v %v", ok, err)
		}
		fatalIf(t, db.Driver.Commit(ctx, tx), "commit")
		if got, err := k.GetIdempotencyKey(ctx, db.Driver.Pool(), p.IdempotencyKeyRef); err != nil || !got.Completed || db.count(t, "reservation") != 1 {
			t.Fatalf("after commit: %+v %v, want completed with the business row", got, err)
		}
	})

	// A dialect without driver.IdempotencyKeyLocker relies on its insert's
	// row lock or its database lock, which package idempotency's
	// TestTxConcurrentRequests checks on every dialect.
	t.Run("LockedUntilTheTransactionEnds", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		locker, ok := db.Driver.Dialect().(driver.IdempotencyKeyLocker)
		if !ok {
			return
		}
		ctx := testsvc.Ctx(t, time.Minute)
		ref := driver.IdempotencyKeyRef{Scope: "s", Key: "locked"}
		try := func(tx TTx, ref driver.IdempotencyKeyRef) bool {
			t.Helper()
			ok, err := locker.TryLockIdempotencyKey(ctx, db.Driver.Tx(tx), ref)
			fatalIf(t, err, "try lock")
			return ok
		}
		tx1, tx2 := db.begin(t, ctx), db.begin(t, ctx)
		if !try(tx1, ref) {
			t.Fatal("first lock of a key: not taken")
		}
		if !try(tx1, ref) {
			t.Fatal("the same transaction again: not taken")
		}
		if try(tx2, ref) {
			t.Fatal("a second transaction took the key the first holds")
		}
		if !try(tx2, driver.IdempotencyKeyRef{Scope: "s", Key: "other"}) || !try(tx2, driver.IdempotencyKeyRef{Scope: "t", Key: "locked"}) {
			t.Fatal("another key, or the key in another scope, is held up")
		}
		fatalIf(t, db.Driver.Commit(ctx, tx1), "commit")
		if !try(tx2, ref) {
			t.Fatal("the key is still locked after the holder committed")
		}
		fatalIf(t, db.Driver.Rollback(ctx, tx2), "rollback")

		// The lock and the insert in one step.
		k := db.Driver.Dialect()
		p := claim("s", "lock-insert", uuid.NewString())
		tx1, tx2 = db.begin(t, ctx), db.begin(t, ctx)
		lockInsert := func(tx TTx, p driver.IdempotencyKeyClaimParams) (bool, bool) {
			t.Helper()
			locked, inserted, err := locker.TryLockInsertIdempotencyKey(ctx, db.Driver.Tx(tx), p)
			fatalIf(t, err, "try lock and insert")
			return locked, inserted
		}
		if locked, inserted := lockInsert(tx1, p); !locked || !inserted {
			t.Fatalf("a new key: locked %v, inserted %v; want both", locked, inserted)
		}
		if locked, inserted := lockInsert(tx2, claim("s", "lock-insert", uuid.NewString())); locked || inserted {
			t.Fatalf("the key another transaction holds: locked %v, inserted %v; want neither, at once", locked, inserted)
		}
		fatalIf(t, db.Driver.Commit(ctx, tx1), "commit")
		if locked, inserted := lockInsert(tx2, claim("s", "lock-insert", uuid.NewString())); !locked || inserted {
			t.Fatalf("the key once committed: locked %v, inserted %v; want locked, not inserted", locked, inserted)
		}
		if got, err := k.GetIdempotencyKey(ctx, db.Driver.Tx(tx2), p.IdempotencyKeyRef); err != nil || got.Owner != p.Owner {
			t.Fatalf("the committed key: %+v %v, want the first owner's", got, err)
		}
		fatalIf(t, db.Driver.Rollback(ctx, tx2), "rollback")
	})

	t.Run("KeysCompareExactly", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		k := db.Driver.Dialect()
		ctx := testsvc.Ctx(t, time.Minute)
		// Each is another key: case, Unicode normalisation (é composed and
		// decomposed), scope, length.
		for _, ref := range []driver.IdempotencyKeyRef{
			{Key: "key"}, {Key: "Key"}, {Key: "KEY"}, {Key: "\u00e9"}, {Key: "e\u0301"},
			{Scope: "tenant-1", Key: "key"}, {Scope: "Tenant-1", Key: "key"},
			{Key: strings.Repeat("k", 255)}, {Key: strings.Repeat("é", 127)},
			{Key: "k ey"}, {Key: "k\u00a0ey"}, {Key: "☃ \U0001F4E6"},
		} {
			ok, err := k.InsertIdempotencyKey(ctx, db.Driver.Pool(), claim(ref.Scope, ref.Key, uuid.NewString()))
			fatalIf(t, err, "insert %q/%q", ref.Scope, ref.Key)
			if !ok {
				t.Errorf("scope %q key %q: taken for an earlier one", ref.Scope, ref.Key)
				continue
			}
			got, err := k.GetIdempotencyKey(ctx, db.Driver.Pool(), ref)
			fatalIf(t, err, "get %q", ref.Key)
			if got.Key != ref.Key || got.Scope != ref.Scope {
				t.Errorf("read back scope %q key %q, want %q %q", got.Scope, got.Key, ref.Scope, ref.Key)
			}
		}
	})

	t.Run("Reclaim", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		k := db.Driver.Dialect()
		ctx := testsvc.Ctx(t, time.Minute)
		pool := db.Driver.Pool()
		insert := func(p driver.IdempotencyKeyClaimParams) {
			t.Helper()
			if ok, err := k.InsertIdempotencyKey(ctx, pool, p); err != nil || !ok {
				t.Fatalf("insert %s: %v %v", p.Key, ok, err)
			}
		}
		reclaim := func(p driver.IdempotencyKeyClaimParams, at time.Time, previous string) bool {
			t.Helper()
			r := p
			r.Owner, r.PreviousOwner, r.Fingerprint = uuid.NewString(), previous, "fp-new"
			r.Now, r.LockedUntil, r.ExpiresAt = at, at.Add(10*time.Second), at.Add(24*time.Hour)
			ok, err := k.ReclaimIdempotencyKey(ctx, pool, r)
			fatalIf(t, err, "reclaim %s", p.Key)
			if ok {
				got, err := k.GetIdempotencyKey(ctx, pool, p.IdempotencyKeyRef)
				fatalIf(t, err, "get")
				if got.Owner != r.Owner || got.Fingerprint != "fp-new" || got.Completed || got.Status != 0 || len(got.Body) != 0 ||
					!got.CreatedAt.Equal(at) || !got.LockedUntil.Equal(r.LockedUntil) || !got.ExpiresAt.Equal(r.ExpiresAt) || !got.CompletedAt.IsZero() {
					t.Fatalf("after a reclaim: %+v, want a fresh processing key for %+v", got, r)
				}
			}
			return ok
		}

		// Processing, lock running: no.
		running := claim("", "running", uuid.NewString())
		insert(running)
		if reclaim(running, now.Add(5*time.Second), running.Owner) {
			t.Error("a key whose lock runs was reclaimed")
		}
		// Lock expired: yes, from the owner read only.
		crashed := claim("", "crashed", uuid.NewString())
		insert(crashed)
		if reclaim(crashed, now.Add(10*time.Second), "not the owner") {
			t.Error("reclaimed from an owner that does not hold the key")
		}
		if !reclaim(crashed, now.Add(10*time.Second), crashed.Owner) {
			t.Error("a key whose lock expired was not reclaimed")
		}
		// Completed, lock expired but not the key: no.
		done := claim("", "done", uuid.NewString())
		insert(done)
		if ok, err := k.CompleteIdempotencyKey(ctx, pool, driver.IdempotencyKeyCompleteParams{IdempotencyKeyRef: done.IdempotencyKeyRef, Owner: done.Owner, Status: 200, Body: []byte("x"), Now: now}); err != nil || !ok {
			t.Fatalf("complete: %v %v", ok, err)
		}
		if reclaim(done, now.Add(time.Hour), done.Owner) {
			t.Error("a completed key was reclaimed before it expired")
		}
		// Expired, completed or not: yes.
		if !reclaim(done, now.Add(24*time.Hour), done.Owner) {
			t.Error("an expired completed key was not reclaimed")
		}
		if !reclaim(running, now.Add(24*time.Hour), running.Owner) {
			t.Error("an expired processing key was not reclaimed")
		}
	})

	t.Run("Release", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		k := db.Driver.Dialect()
		ctx := testsvc.Ctx(t, time.Minute)
		pool := db.Driver.Pool()
		p := claim("s", "release", uuid.NewString())
		if ok, err := k.InsertIdempotencyKey(ctx, pool, p); err != nil || !ok {
			t.Fatalf("insert: %v %v", ok, err)
		}
		if ok, err := k.ReleaseIdempotencyKey(ctx, pool, p.IdempotencyKeyRef, "not the owner"); err != nil || ok {
			t.Fatalf("release by another owner: %v %v, want false", ok, err)
		}
		if ok, err := k.ReleaseIdempotencyKey(ctx, pool, p.IdempotencyKeyRef, p.Owner); err != nil || !ok {
			t.Fatalf("release by the owner: %v %v, want true", ok, err)
		}
		if _, err := k.GetIdempotencyKey(ctx, pool, p.IdempotencyKeyRef); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("get after release: %v, want ErrNotFound", err)
		}
		if ok, err := k.InsertIdempotencyKey(ctx, pool, p); err != nil || !ok {
			t.Fatalf("insert after release: %v %v", ok, err)
		}
	})

	t.Run("Purge", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		k := db.Driver.Dialect()
		ctx := testsvc.Ctx(t, time.Minute)
		pool := db.Driver.Pool()
		for i := range 25 {
			p := claim("", "k-"+string(rune('a'+i)), uuid.NewString())
			p.ExpiresAt = now.Add(time.Duration(i-20) * time.Minute) // 21 expired (i <= 20), 4 not
			if ok, err := k.InsertIdempotencyKey(ctx, pool, p); err != nil || !ok {
				t.Fatalf("insert: %v %v", ok, err)
			}
			if i%2 == 0 {
				_, err := k.CompleteIdempotencyKey(ctx, pool, driver.IdempotencyKeyCompleteParams{IdempotencyKeyRef: p.IdempotencyKeyRef, Owner: p.Owner, Status: 200, Now: now})
				fatalIf(t, err, "complete")
			}
		}
		var total int64
		for {
			n, err := k.PurgeIdempotencyKeys(ctx, pool, driver.IdempotencyKeyPurgeParams{Before: now, Limit: 10})
			fatalIf(t, err, "purge")
			if n > 10 {
				t.Fatalf("purge with limit 10 deleted %d", n)
			}
			total += n
			if n < 10 {
				break
			}
		}
		if total != 21 || db.count(t, idem.IdempotentRequestTableDefault) != 4 {
			t.Fatalf("purged %d, %d left; want 21 purged, the 4 keys not expired left", total, db.count(t, idem.IdempotentRequestTableDefault))
		}
	})

	t.Run("ConcurrentClaims", func(t *testing.T) {
		t.Parallel()
		db := setup.open(t, Options{})
		k := db.Driver.Dialect()
		ctx := testsvc.Ctx(t, time.Minute)
		pool := db.Driver.Pool()
		var (
			wg       sync.WaitGroup
			inserted atomic.Int32
			start    = make(chan struct{})
		)
		for range 8 {
			wg.Go(func() {
				<-start
				ok, err := k.InsertIdempotencyKey(ctx, pool, claim("", "race", uuid.NewString()))
				if err != nil {
					t.Error(err)
				}
				if ok {
					inserted.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		if n := inserted.Load(); n != 1 {
			t.Fatalf("8 concurrent claims of one key: %d inserted, want 1", n)
		}
	})
}
