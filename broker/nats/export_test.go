package nats

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// SetDropDelivery makes s drop the deliveries drop returns true for, as if
// they were lost on the way. Call it before Start.
func SetDropDelivery(s *Subscriber, drop func(jetstream.Msg) bool) { s.dropDelivery = drop }

// Gaps returns the number of lost deliveries s has seen.
func Gaps(s *Subscriber) int { return int(s.gaps.Load()) }

// RenewBehindItsBack writes s's lease again, with s's own value, without
// telling s: as a renewal whose write succeeded but whose reply was lost
// would, the key moves to a revision s does not know.
func RenewBehindItsBack(ctx context.Context, s *Subscriber) error {
	l := s.lease
	l.mu.Lock()
	rev := l.rev
	l.mu.Unlock()
	_, err := l.kv.Update(ctx, l.key, l.value, rev)
	return err
}

// TakeLeaseBehindItsBack writes another owner's value over s's lease, as a
// process that took it would.
func TakeLeaseBehindItsBack(ctx context.Context, s *Subscriber) error {
	l := s.lease
	_, err := l.kv.Put(ctx, l.key, []byte("another process"))
	return err
}

// RenewLease renews s's lease now, as its renewal timer would, and reports
// whether s still holds it.
func RenewLease(ctx context.Context, s *Subscriber) (bool, error) { return s.lease.acquire(ctx) }

// LeaseTTL returns the time to live s's lease runs with.
func LeaseTTL(s *Subscriber) time.Duration { return s.lease.ttl }

// OrderKey is orderKey, for the tests of CloudEvents from other programs.
var OrderKey = orderKey
