package nats

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// OwnersBucket returns the name of the key-value bucket holding the
// ownership leases of the durable consumers of stream: idem_owners_<stream>
// (characters a bucket name cannot hold replaced by _). The key of a
// durable consumer's lease is its name.
func OwnersBucket(stream string) string {
	return OwnersBucketPrefix + invalidBucketChars.ReplaceAllString(stream, "_")
}

var (
	invalidBucketChars = regexp.MustCompile(`[^a-zA-Z0-9_-]`)
	validKey           = regexp.MustCompile(`^[-_=a-zA-Z0-9]+$`)
)

// leaseKey returns the lease key of a durable consumer: its name, or, when
// the name holds characters a key cannot, "x" and its name in hex.
func leaseKey(durable string) string {
	if validKey.MatchString(durable) {
		return durable
	}
	return "x" + hex.EncodeToString([]byte(durable))
}

// lease is a subscriber's ownership of its durable consumer: a key in the
// owners bucket, whose MaxAge is the lease's time to live. Create takes it,
// a compare-and-set Update renews it, Delete (at the held revision)
// releases it.
type lease struct {
	kv    jetstream.KeyValue
	key   string
	value []byte
	ttl   time.Duration
	log   *slog.Logger

	mu    sync.Mutex
	rev   uint64    // 0: not held
	until time.Time // when the lease runs out unless renewed
}

// ErrOwnerTTL is returned (wrapped) by Subscriber.Start when
// SubscriberConfig.OwnerTTL differs from the time to live of the stream's
// owners bucket, which every subscriber of the stream shares.
var ErrOwnerTTL = errors.New("OwnerTTL differs from the owners bucket's")

// newLease creates the owners bucket of cfg's stream (TTL cfg.OwnerTTL,
// default OwnerTTLDefault; replicas those of the stream, which
// cfg.Stream.Replicas holds), or checks the existing one's TTL against
// cfg.OwnerTTL (ErrOwnerTTL) and brings its replicas to the stream's, and
// returns the lease of cfg's durable consumer, not yet held, with the
// bucket's TTL.
func newLease(ctx context.Context, js jetstream.JetStream, cfg SubscriberConfig, log *slog.Logger) (*lease, error) {
	bucket := OwnersBucket(cfg.Stream.Name)
	storage := jetstream.FileStorage
	if cfg.Stream.MemoryStorage {
		storage = jetstream.MemoryStorage
	}
	replicas := max(cfg.Stream.Replicas, 1)
	kvc := jetstream.KeyValueConfig{
		Bucket:      bucket,
		Description: "idem: owners of the durable consumers of stream " + cfg.Stream.Name,
		History:     1,
		TTL:         cmp.Or(cfg.OwnerTTL, OwnerTTLDefault),
		Replicas:    replicas,
		Storage:     storage,
	}
	for range 2 {
		kv, err := js.KeyValue(ctx, bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			kv, err = js.CreateKeyValue(ctx, kvc)
			if errors.Is(err, jetstream.ErrBucketExists) {
				continue // created meanwhile by another subscriber: check it
			}
			if err != nil {
				return nil, fmt.Errorf("idem: nats: create the key-value bucket %s (ownership of durable consumers): %w", bucket, err)
			}
			return newLeaseOn(kv, cfg, kvc.TTL, log), nil
		}
		if err != nil {
			return nil, fmt.Errorf("idem: nats: open the key-value bucket %s (ownership of durable consumers): %w", bucket, err)
		}
		st, err := kv.Status(ctx)
		if err != nil {
			return nil, fmt.Errorf("idem: nats: read the key-value bucket %s (ownership of durable consumers): %w", bucket, err)
		}
		ttl := st.TTL()
		if ttl < time.Second || (cfg.OwnerTTL != 0 && ttl != cfg.OwnerTTL) {
			// Renewing every OwnerTTL/3 a lease that the bucket expires
			// sooner would let another process take it while this one
			// still consumes: refuse rather than change the TTL under
			// the subscribers that run with it.
			return nil, fmt.Errorf("idem: nats: the key-value bucket %s keeps the ownership leases for %v but SubscriberConfig.OwnerTTL is %v: %w; "+
				"give every subscriber of stream %s the same OwnerTTL (0 takes the bucket's); to change it, stop every subscriber of the stream, "+
				"delete the bucket (nats kv del %s) and start them with the new value",
				bucket, ttl, cfg.OwnerTTL, ErrOwnerTTL, cfg.Stream.Name, bucket)
		}
		if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok && bs.StreamInfo().Config.Replicas != replicas {
			// The leases must survive what the stream survives.
			log.Warn("nats subscriber: changing the owners bucket's number of replicas to the stream's",
				"bucket", bucket, "from", bs.StreamInfo().Config.Replicas, "to", replicas)
			kvc.TTL = ttl
			if kv, err = js.UpdateKeyValue(ctx, kvc); err != nil {
				return nil, fmt.Errorf("idem: nats: update the replicas of the key-value bucket %s (ownership of durable consumers): %w", bucket, err)
			}
		}
		return newLeaseOn(kv, cfg, ttl, log), nil
	}
	return nil, fmt.Errorf("idem: nats: the key-value bucket %s (ownership of durable consumers) exists but cannot be opened", bucket)
}

// newLeaseOn returns the lease of cfg's durable consumer in kv, whose keys
// live for ttl, not yet held.
func newLeaseOn(kv jetstream.KeyValue, cfg SubscriberConfig, ttl time.Duration, log *slog.Logger) *lease {
	host, _ := os.Hostname()
	return &lease{
		kv:    kv,
		key:   leaseKey(cfg.Durable()),
		value: fmt.Appendf(nil, "%s pid %d %s", host, os.Getpid(), nuid.Next()),
		ttl:   ttl,
		log:   log,
	}
}

// acquire takes the lease, or renews it when held, and reports whether it
// is held. It reports false, without error, when another subscriber holds
// it; an error leaves the state unknown (the lease runs out at its time).
func (l *lease) acquire(ctx context.Context) (bool, error) {
	l.mu.Lock()
	rev := l.rev
	l.mu.Unlock()
	sent := time.Now()
	var err error
	var next uint64
	if rev == 0 {
		next, err = l.kv.Create(ctx, l.key, l.value)
	} else {
		next, err = l.kv.Update(ctx, l.key, l.value, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		// Someone else's, or still ours: an earlier Create or Update of
		// ours succeeded but its reply was lost (a timeout), so the key
		// moved to a revision we did not learn. Our value (unique to this
		// lease) says it is ours; renew it at that revision, so that it is
		// ours for a full TTL from now.
		e, gerr := l.kv.Get(ctx, l.key)
		switch {
		case errors.Is(gerr, jetstream.ErrKeyNotFound):
			return l.lost(), nil // expired or released since
		case gerr != nil:
			return false, fmt.Errorf("idem: nats: lease %s of bucket %s: read it after a conflicting write: %w", l.key, l.kv.Bucket(), gerr)
		case string(e.Value()) != string(l.value):
			return l.lost(), nil
		}
		next, err = l.kv.Update(ctx, l.key, l.value, e.Revision())
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
			return l.lost(), nil
		}
	}
	if err != nil {
		return false, fmt.Errorf("idem: nats: lease %s of bucket %s: %w", l.key, l.kv.Bucket(), err)
	}
	l.set(next, sent.Add(l.ttl))
	return true, nil
}

// lost records that the lease is not held and returns false.
func (l *lease) lost() bool {
	l.set(0, time.Time{})
	return false
}

func (l *lease) set(rev uint64, until time.Time) {
	l.mu.Lock()
	l.rev, l.until = rev, until
	l.mu.Unlock()
}

// valid reports whether the lease is held and has not run out: measured
// from when the last successful write was sent, so it runs out no later
// than on the server.
func (l *lease) valid() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rev != 0 && time.Now().Before(l.until)
}

// keep renews the held lease every TTL/3 (a failed renewal is tried again
// every leaseRetry) until done closes. When the lease is lost (another
// subscriber holds it) or runs out before a renewal succeeds, it calls lost
// and returns.
func (l *lease) keep(ctx context.Context, done <-chan struct{}, lost func()) {
	every := l.ttl / 3
	next := time.NewTimer(every)
	defer next.Stop()
	for {
		l.mu.Lock()
		timeout := time.NewTimer(max(time.Until(l.until), time.Millisecond))
		l.mu.Unlock()
		select {
		case <-done:
			timeout.Stop()
			return
		case <-ctx.Done():
			timeout.Stop()
			return
		case <-timeout.C:
			if !l.valid() {
				l.log.Warn("nats subscriber: the lease on the durable consumer ran out before it could be renewed; standing by", "key", l.key)
				lost()
				return
			}
			continue
		case <-next.C:
			timeout.Stop()
		}
		actx, cancel := context.WithTimeout(ctx, every)
		held, err := l.acquire(actx)
		cancel()
		switch {
		case err != nil:
			l.log.Debug("nats subscriber: renew the lease", "key", l.key, "error", err)
			next.Reset(min(every, leaseRetry))
		case !held:
			l.log.Warn("nats subscriber: another process took the durable consumer's lease; standing by", "key", l.key)
			lost()
			return
		default:
			next.Reset(every)
		}
		if !l.valid() {
			l.log.Warn("nats subscriber: the lease on the durable consumer ran out before it could be renewed; standing by", "key", l.key, "error", err)
			lost()
			return
		}
	}
}

// leaseRetry is the delay before trying again a renewal that failed (the
// key-value bucket's leader may be changing).
const leaseRetry = 200 * time.Millisecond

// release deletes the lease if it is held (at its revision, so that a lease
// another subscriber took in the meantime stays).
func (l *lease) release(ctx context.Context) {
	if l == nil {
		return
	}
	l.mu.Lock()
	rev := l.rev
	l.rev = 0
	l.mu.Unlock()
	if rev == 0 {
		return
	}
	if err := l.kv.Delete(ctx, l.key, jetstream.LastRevision(rev)); err != nil {
		l.log.Debug("nats subscriber: release the lease (it runs out by itself)", "key", l.key, "error", err)
	}
}

// owner returns the value of the lease (who holds it), "" when unknown.
func (l *lease) owner(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	e, err := l.kv.Get(ctx, l.key)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(e.Value()))
}
