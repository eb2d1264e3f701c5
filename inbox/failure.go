package inbox

import (
	"context"
	"time"

	"github.com/idem-go/idem/driver"
)

// FailureStore is the failed_message table of a consumer database: messages
// that could not be decoded or kept failing, kept with their raw bytes and
// headers so they can be shown, retried exactly as received, or removed.
type FailureStore struct {
	d  driver.Dialect
	ex driver.Executor
}

// NewFailureStore returns the failure store of dialect's tables on ex.
func NewFailureStore(d driver.Dialect, ex driver.Executor) *FailureStore {
	return &FailureStore{d: d, ex: ex}
}

// Save stores m and returns its id. Saving a message whose event id is already
// stored for the same consumer updates that entry and appends to its history.
func (s *FailureStore) Save(ctx context.Context, m driver.FailedMessage) (int64, error) {
	return s.d.SaveFailed(ctx, s.ex, m)
}

// List returns stored messages matching f, newest first.
func (s *FailureStore) List(ctx context.Context, f driver.FailedFilter) ([]driver.FailedMessage, error) {
	return s.d.ListFailed(ctx, s.ex, f)
}

// Get returns one stored message or driver.ErrNotFound.
func (s *FailureStore) Get(ctx context.Context, id int64) (driver.FailedMessage, error) {
	return s.d.GetFailed(ctx, s.ex, id)
}

// Remove deletes one stored message and reports whether it existed.
func (s *FailureStore) Remove(ctx context.Context, id int64) (bool, error) {
	return s.d.DeleteFailed(ctx, s.ex, id)
}

// FailedSince is a convenience filter for messages failed in the last d.
func FailedSince(d time.Duration) driver.FailedFilter {
	return driver.FailedFilter{Since: time.Now().Add(-d)}
}
