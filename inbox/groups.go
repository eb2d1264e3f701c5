package inbox

import (
	"context"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/internal/failgroup"
)

// FailureGroup is a group of parked messages of one consumer that failed
// for one cause: the same class of failure and the same error text once
// its variable parts (UUIDs, numbers, quoted values, hex, times) are
// normalized away. "idem failed groups" lists them; "idem failed retry
// --group ID" and "remove --group ID" act on one.
type FailureGroup struct {
	// ID identifies the group: 12 hex digits of a hash of the consumer,
	// the class and the cause, the same from one run to the next.
	ID string `json:"id"`
	// Consumer is the consumer name.
	Consumer string `json:"consumer"`
	// Class is the kind of failure, read from what the store holds:
	// "undecodable" (the message could not be decoded), "permanent" (a
	// handler returned idem.Permanent), "exhausted" (a handler failed on
	// every attempt the retry policy allows) or "held" (the message waits
	// behind a parked message of its aggregate).
	Class string `json:"class"`
	// Cause is the error text, normalized: "idem: handling
	// order.order.placed.v1 <uuid>: permanent: field <q> is <n>".
	Cause string `json:"cause"`
	// Example is the error of the group's most recently failed message,
	// as stored.
	Example string `json:"example"`
	// Count is the number of messages.
	Count int `json:"count"`
	// FirstFailed and LastFailed are the earliest first failure and the
	// latest last failure of its messages.
	FirstFailed time.Time `json:"first_failed"`
	LastFailed  time.Time `json:"last_failed"`
}

// GroupOf returns the id, class and normalized cause of the group of m.
// The messages held behind parked messages of an aggregate type are one
// group: their aggregate ids are normalized away too.
func GroupOf(m idem.FailedMessage) (id, class, cause string) {
	class = failgroup.ConsumerClass(m.Error, m.HeldBy)
	if class == failgroup.ClassHeld {
		cause = failgroup.HeldCause(m.Error, m.AggregateID)
	} else {
		cause = failgroup.Normalize(m.Error)
	}
	return failgroup.ID(m.Consumer, class, cause), class, cause
}

// GroupCounter adds parked messages up into FailureGroups, a page at a
// time: its memory grows with the number of groups, not of messages.
type GroupCounter struct {
	c failgroup.Counter
}

// Add counts m and returns its group's id.
func (g *GroupCounter) Add(m idem.FailedMessage) string {
	_, class, cause := GroupOf(m)
	return g.c.AddCause(m.Consumer, class, cause, m.Error, m.FirstFailed, m.LastFailed)
}

// Len returns the number of groups counted.
func (g *GroupCounter) Len() int { return g.c.Len() }

// Groups returns the groups counted, largest first.
func (g *GroupCounter) Groups() []FailureGroup {
	gs := g.c.Groups()
	out := make([]FailureGroup, len(gs))
	for i, x := range gs {
		out[i] = FailureGroup{ID: x.ID, Consumer: x.Scope, Class: x.Class, Cause: x.Cause, Example: x.Example,
			Count: x.Count, FirstFailed: x.FirstSeen, LastFailed: x.LastSeen}
	}
	return out
}

// Groups returns the groups of the messages matching f, largest first. It
// reads every match in pages of f.Limit (0: FailedPageSizeDefault), so it
// costs a read of the store's messages; the grouping is done here, as the
// store keeps the error's text only.
func (s *FailureStore) Groups(ctx context.Context, f idem.FailedFilter) ([]FailureGroup, error) {
	var c GroupCounter
	err := s.Pages(ctx, f, func(page []idem.FailedMessage) error {
		for _, m := range page {
			c.Add(m)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return c.Groups(), nil
}

// snapshot returns f set to list, oldest first, the messages matching f
// stored so far only (f.BeforeID past the newest), in pages of
// FailedPageSizeDefault, and false when none matches: the filter of a run
// over every match that leaves out the messages parked while it runs (a
// retried message failing again).
func (s *FailureStore) snapshot(ctx context.Context, f idem.FailedFilter) (idem.FailedFilter, bool, error) {
	newest := f
	newest.Limit, newest.Oldest, newest.AfterID = 1, false, 0
	last, err := s.d.ListFailed(ctx, s.ex, newest)
	if err != nil || len(last) == 0 {
		return f, false, err
	}
	f.BeforeID = last[0].ID + 1
	f.Oldest = true
	f.Limit = FailedPageSizeDefault
	return f, true, nil
}

// RetryGroup re-drives the messages of group id among those matching f
// and stored when it starts, oldest first, each followed by the messages
// held behind it (Retry), so that an aggregate's messages go back in the
// order they were parked. With id "" it re-drives every match, oldest
// first, each alone (Redrive), as "idem failed retry --all" does: the
// messages held behind one go back when they match f. report, when not nil, is called after each
// message with Redrive's result and whether the message is of the group
// (false: held behind one). It returns how many messages of the group it
// found, and how many messages were sent and not sent; err is an error
// reading the store, which stops it.
func (s *FailureStore) RetryGroup(ctx context.Context, rd broker.Redeliverer, f idem.FailedFilter, id string, report func(m idem.FailedMessage, inGroup bool, err error)) (found, sent, failed int, err error) {
	f, ok, err := s.snapshot(ctx, f)
	if err != nil || !ok {
		return 0, 0, 0, err
	}
	err = s.Pages(ctx, f, func(page []idem.FailedMessage) error {
		for _, m := range page {
			if id == "" {
				found++
				err := s.redrive(ctx, rd, m)
				if report != nil {
					report(m, true, err)
				}
				if err != nil {
					failed++
				} else {
					sent++
				}
				continue
			}
			if gid, _, _ := GroupOf(m); gid != id {
				continue
			}
			found++
			n, notSent, err := s.Retry(ctx, rd, m, func(h idem.FailedMessage, err error) {
				if report != nil {
					report(h, h.ID == m.ID, err)
				}
			})
			sent, failed = sent+n, failed+notSent
			if err != nil {
				return err
			}
		}
		return nil
	})
	return found, sent, failed, err
}

// RemoveGroup removes the messages of group id (every match with id "")
// among those matching f and stored when it starts. report, when not nil, is called after each
// removal. It returns how many it removed. Removing a message releases its
// aggregate: the messages held behind it stay in the store.
func (s *FailureStore) RemoveGroup(ctx context.Context, f idem.FailedFilter, id string, report func(idem.FailedMessage)) (removed int, err error) {
	return s.eachOfGroup(ctx, f, id, s.Remove, report)
}

// ArchiveGroup archives (Archive) the messages of group id (every match
// with id "") among those matching f and stored when it starts. report,
// when not nil, is called after each one archived. It returns how many it
// archived.
func (s *FailureStore) ArchiveGroup(ctx context.Context, f idem.FailedFilter, id string, report func(idem.FailedMessage)) (archived int, err error) {
	return s.eachOfGroup(ctx, f, id, s.Archive, report)
}

// eachOfGroup calls do with the id of each message of group id (every
// match with id "") among those matching f and stored when it starts, and
// report after each call that returned true; it returns how many did.
func (s *FailureStore) eachOfGroup(ctx context.Context, f idem.FailedFilter, id string, do func(context.Context, int64) (bool, error), report func(idem.FailedMessage)) (removed int, err error) {
	f, ok, err := s.snapshot(ctx, f)
	if err != nil || !ok {
		return 0, err
	}
	err = s.Pages(ctx, f, func(page []idem.FailedMessage) error {
		for _, m := range page {
			if gid, _, _ := GroupOf(m); id != "" && gid != id {
				continue
			}
			ok, err := do(ctx, m.ID)
			if err != nil {
				return err
			}
			if ok {
				removed++
				if report != nil {
					report(m)
				}
			}
		}
		return nil
	})
	return removed, err
}
