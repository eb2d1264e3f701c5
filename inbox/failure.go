package inbox

import (
	"context"
	"fmt"
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
type FailureStore struct {
	d  driver.Dialect
	ex driver.Executor
}

// Database is what a FailureStore reads and writes: any driver
// (postgres.NewPgx(pool), postgres.NewSQL(db), mysql.New(db), sqlite.New(db)).
type Database interface {
	Dialect() driver.Dialect
	Pool() driver.Executor
}

// NewFailureStore returns the failure store of db's tables.
func NewFailureStore(db Database) *FailureStore {
	return &FailureStore{d: db.Dialect(), ex: db.Pool()}
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

// Remove deletes one stored message and reports whether it existed.
func (s *FailureStore) Remove(ctx context.Context, id int64) (bool, error) {
	return s.d.DeleteFailed(ctx, s.ex, id)
}

// FailedSince is a convenience filter for messages failed in the last d.
func FailedSince(d time.Duration) idem.FailedFilter {
	return idem.FailedFilter{Since: time.Now().Add(-d)}
}
