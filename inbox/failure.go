package inbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
)

// FailedPageSizeDefault is the page size of FailureStore.Pages, and of
// FailureStore.List when it lists every match. Entries hold whole message
// bodies: pages stay small.
const FailedPageSizeDefault = 100

// FailureStore is the failed_message table of a consumer database: messages
// that could not be decoded or kept failing, kept with their raw bytes and
// headers so they can be shown, retried exactly as received, or removed.
//
// Operators edit an entry's message (Edit), archive it (Archive), send it
// back to its queue (Retry) or to another consumer (Redirect), or remove
// it (Remove); each of these but a removal is recorded in the entry's
// audit trail (idem.FailedMessage.Actions) with who did it (As).
type FailureStore struct {
	d  driver.Dialect
	ex driver.Executor
	// inTx runs a function in a transaction; nil when the database given
	// cannot (not a driver.Transactor).
	inTx func(ctx context.Context, fn func(driver.Executor) error) error
	hook FailureHook
	by   string
}

// Database is what a FailureStore reads and writes: any driver
// (postgres.NewPgx(pool), postgres.NewSQL(db), mysql.New(db), sqlite.New(db)).
type Database interface {
	Dialect() driver.Dialect
	Pool() driver.Executor
}

// FailureHook is called with a notice of a failure, or of its resolution,
// in the transaction that parks or resolves it (ex runs in it): an error
// rolls that transaction back, so that a notice exists if and only if what
// it tells of committed. outbox.FailureEvents returns one that writes the
// notice into an outbox as an event. See Config.OnFailure and
// FailureStore.WithFailureHook.
type FailureHook func(ctx context.Context, ex driver.Executor, n idem.FailureNotice) error

// NewFailureStore returns the failure store of db's tables. Every driver of
// the dialect packages runs transactions (driver.Transactor), which a
// FailureHook needs.
func NewFailureStore(db Database) *FailureStore {
	s := &FailureStore{d: db.Dialect(), ex: db.Pool()}
	if t, ok := db.(driver.Transactor); ok {
		s.inTx = t.InTx
	}
	return s
}

// newFailureStore returns the failure store of drv, which runs
// transactions whether it is a driver.Transactor or not.
func newFailureStore[TTx any](drv driver.Driver[TTx]) *FailureStore {
	s := NewFailureStore(drv)
	s.inTx = func(ctx context.Context, fn func(driver.Executor) error) error { return driver.InTx(ctx, drv, fn) }
	return s
}

// As returns a copy of s whose actions are recorded as done by by (a user
// name) in the audit trail of the entries and in the notices of their
// resolution.
func (s *FailureStore) As(by string) *FailureStore {
	c := *s
	c.by = by
	return &c
}

// WithFailureHook returns a copy of s that calls hook with a notice
// (idem.FailureMessageResolved) of each entry it removes, archives or
// redirects, in the transaction that does it: what "idem failed
// --failure-events" and the dashboard do, so that services following
// failures hear of those resolved by an operator. A nil hook calls
// nothing.
func (s *FailureStore) WithFailureHook(hook FailureHook) *FailureStore {
	c := *s
	c.hook = hook
	return &c
}

// ErrNoTransactions is returned by a FailureStore with a FailureHook whose
// database cannot run transactions (a Database that is not a
// driver.Transactor): the notices could not commit with what they tell of.
var ErrNoTransactions = errors.New("idem: failure store: a failure hook needs a database that runs transactions (a driver of the dialect packages)")

// tx runs fn in a transaction when s has a hook (which fn calls), on the
// pool otherwise.
func (s *FailureStore) tx(ctx context.Context, fn func(ex driver.Executor) error) error {
	if s.hook == nil {
		return fn(s.ex)
	}
	if s.inTx == nil {
		return ErrNoTransactions
	}
	return s.inTx(ctx, fn)
}

// notify calls the hook, if any, with the resolution of m.
func (s *FailureStore) notify(ctx context.Context, ex driver.Executor, m idem.FailedMessage, resolution, to string) error {
	if s.hook == nil || idem.IsFailureNotice(m.EventName) {
		return nil
	}
	n := Notice(idem.FailureMessageResolved, m)
	n.Resolution, n.RedirectedTo, n.By = resolution, to, s.by
	return s.hook(ctx, ex, n)
}

// Notice returns the notice named name (idem.FailureMessageParked or
// idem.FailureMessageResolved) of the failure store entry m, dated now,
// with its class and group (GroupOf), its body and headers.
func Notice(name string, m idem.FailedMessage) idem.FailureNotice {
	group, class, _ := GroupOf(m)
	return idem.FailureNotice{
		Name: name, At: time.Now().UTC(), Consumer: m.Consumer, Source: m.Source, FailedMessageID: m.ID,
		Class: class, Group: group, EventID: m.EventID, EventName: m.EventName,
		AggregateType: m.AggregateType, AggregateID: m.AggregateID, HeldBy: m.HeldBy,
		Attempts: m.Attempts, Error: m.Error, Headers: m.Headers, Body: m.Body,
	}
}

// Save stores m and returns its id. With m.ID 0 it adds an entry, one per
// message, even when another entry has the same event id; with m.ID set it
// records one more failure of that entry (attempts added, history appended,
// error and held-by replaced), whose message stays as first stored (see
// driver.Dialect.SaveFailed).
func (s *FailureStore) Save(ctx context.Context, m idem.FailedMessage) (int64, error) {
	return s.d.SaveFailed(ctx, s.ex, m)
}

// List returns stored messages matching f, newest first (by id, the order in
// which they were first stored), or oldest first with f.Oldest. f.Limit 0
// returns every match: List reads them in pages of FailedPageSizeDefault,
// each starting after the last id of the previous one. Large stores are
// better read with Pages.
func (s *FailureStore) List(ctx context.Context, f idem.FailedFilter) ([]idem.FailedMessage, error) {
	if f.Limit < 0 {
		return nil, fmt.Errorf("idem: failure store: Limit %d: want 0 (all) or a positive number", f.Limit)
	}
	if f.Limit > 0 {
		return s.d.ListFailed(ctx, s.ex, f)
	}
	var out []idem.FailedMessage
	err := s.Pages(ctx, f, func(page []idem.FailedMessage) error {
		out = append(out, page...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Pages calls fn with each page of the messages matching f, in List's order,
// until they end or fn returns an error, which Pages returns. f.Limit is the
// page size (0: FailedPageSizeDefault). Each page starts after the last id
// of the previous one (idem.FailedFilter.NextPage), so fn may remove or
// retry the messages it gets; messages stored meanwhile are listed when
// they come after the cursor (bound the ids with f.BeforeID to leave them
// out of an oldest-first run).
func (s *FailureStore) Pages(ctx context.Context, f idem.FailedFilter, fn func(page []idem.FailedMessage) error) error {
	if f.Limit < 0 {
		return fmt.Errorf("idem: failure store: page size %d: want 0 (the default) or a positive number", f.Limit)
	}
	if f.Limit == 0 {
		f.Limit = FailedPageSizeDefault
	}
	for {
		page, err := s.d.ListFailed(ctx, s.ex, f)
		if err != nil {
			return err
		}
		if len(page) > 0 {
			if err := fn(page); err != nil {
				return err
			}
		}
		if len(page) < f.Limit {
			return nil
		}
		f = f.NextPage(page[len(page)-1])
	}
}

// Count returns how many stored messages match f (f.Limit aside): the
// total of a run over every match, as "idem failed retry --all" shows it.
func (s *FailureStore) Count(ctx context.Context, f idem.FailedFilter) (int64, error) {
	return s.d.CountFailed(ctx, s.ex, f)
}

// Get returns one stored message or idem.ErrNotFound.
func (s *FailureStore) Get(ctx context.Context, id int64) (idem.FailedMessage, error) {
	return s.d.GetFailed(ctx, s.ex, id)
}

// Remove deletes one stored message and reports whether it existed. With a
// FailureHook, the hook is told of it (idem.ResolvedRemoved) in the same
// transaction.
func (s *FailureStore) Remove(ctx context.Context, id int64) (bool, error) {
	return s.resolve(ctx, id, idem.ResolvedRemoved)
}

// resolve deletes entry id, telling the hook of it as resolution.
func (s *FailureStore) resolve(ctx context.Context, id int64, resolution string) (removed bool, err error) {
	if s.hook == nil {
		return s.d.DeleteFailed(ctx, s.ex, id)
	}
	err = s.tx(ctx, func(ex driver.Executor) error {
		m, err := s.d.GetFailed(ctx, ex, id)
		if errors.Is(err, idem.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if removed, err = s.d.DeleteFailed(ctx, ex, id); err != nil || !removed {
			return err
		}
		return s.notify(ctx, ex, m, resolution, "")
	})
	return removed, err
}

// Edit replaces the message of entry id with body and headers, which a
// retry then sends, and records the edit in its audit trail. The message
// as received stays readable (idem.FailedMessage.Original), whatever the
// number of edits. The entry's event id, name and aggregate stay as
// stored: an edit fixes what the consumer could not apply, it does not
// make another event (the consumer would take a new event id for a new
// event, and deduplicate on it). It returns idem.ErrNotFound when the entry
// is gone.
func (s *FailureStore) Edit(ctx context.Context, id int64, body []byte, headers map[string]string) error {
	m, err := s.d.GetFailed(ctx, s.ex, id)
	if err != nil {
		return err
	}
	if body == nil {
		body = []byte{}
	}
	ok, err := s.d.ChangeFailed(ctx, s.ex, id, driver.FailedChange{Edit: true, Body: body, Headers: headers,
		Action: idem.FailedAction{Action: idem.FailedEdit, By: s.by, Detail: EditDetail(m, body, headers)}})
	if err == nil && !ok {
		err = idem.ErrNotFound
	}
	return err
}

// EditDetail describes the edit of m's message into body and headers, as
// the audit trail records it: "body 120 -> 118 bytes; headers set x-a,
// removed x-b".
func EditDetail(m idem.FailedMessage, body []byte, headers map[string]string) string {
	var parts []string
	if !bytes.Equal(m.Body, body) {
		parts = append(parts, fmt.Sprintf("body %d -> %d bytes", len(m.Body), len(body)))
	}
	var set, removed []string
	for k, v := range headers {
		if old, ok := m.Headers[k]; !ok || old != v {
			set = append(set, k)
		}
	}
	for k := range m.Headers {
		if _, ok := headers[k]; !ok {
			removed = append(removed, k)
		}
	}
	slices.Sort(set)
	slices.Sort(removed)
	if len(set) > 0 {
		parts = append(parts, "headers set "+strings.Join(set, ", "))
	}
	if len(removed) > 0 {
		parts = append(parts, "headers removed "+strings.Join(removed, ", "))
	}
	if len(parts) == 0 {
		return "unchanged"
	}
	return strings.Join(parts, "; ")
}

// Archive archives entry id: it stays in the store, readable with Get and
// listed with idem.FailedFilter.Archived, but out of the default lists and
// counts, and it holds its aggregate no longer (the messages held behind
// it stay in the store, to retry or remove, as after a removal). It is
// recorded in the entry's audit trail and, with a FailureHook, told of
// (idem.ResolvedArchived) in the same transaction. It reports whether it
// archived the entry: false when it is gone or archived already. An
// archived entry parked again (a retry fails, a copy of it fails) is not
// archived any more.
func (s *FailureStore) Archive(ctx context.Context, id int64) (bool, error) {
	return s.archive(ctx, id, idem.FailedAction{Action: idem.FailedArchive, By: s.by}, idem.ResolvedArchived, "")
}

// archive archives entry id, recording a, telling the hook of resolution.
func (s *FailureStore) archive(ctx context.Context, id int64, a idem.FailedAction, resolution, to string) (archived bool, err error) {
	err = s.tx(ctx, func(ex driver.Executor) error {
		m, err := s.d.GetFailed(ctx, ex, id)
		if errors.Is(err, idem.ErrNotFound) {
			return nil
		}
		if err != nil || (!m.Archived.IsZero() && resolution == idem.ResolvedArchived) {
			return err
		}
		if archived, err = s.d.ChangeFailed(ctx, ex, id, driver.FailedChange{Archive: true, Action: a}); err != nil || !archived {
			return err
		}
		return s.notify(ctx, ex, m, resolution, to)
	})
	return archived, err
}

// record appends a to the audit trail of entry id, if it is still there.
func (s *FailureStore) record(ctx context.Context, id int64, a idem.FailedAction) error {
	_, err := s.d.ChangeFailed(ctx, s.ex, id, driver.FailedChange{Action: a})
	return err
}

// FailedSince is a convenience filter for messages failed in the last d.
func FailedSince(d time.Duration) idem.FailedFilter {
	return idem.FailedFilter{Since: time.Now().Add(-d)}
}
