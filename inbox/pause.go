package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/pausewatch"
)

// PauseCheckDefault is how often a consumer reads its pause from its
// database (Config.PauseCheck).
const PauseCheckDefault = time.Second

// PauseStore keeps the operators' pauses of the consumers of a database,
// in its consumer_pause table (Tables.ConsumerPause, migration 0015): what
// "idem pause" and "idem resume" and the dashboard write. A consumer reads
// its own pause at most once per Config.PauseCheck: a pause takes effect on
// every replica within that time, and holds through restarts. While it is
// in force, the consumer hands every delivery back to its transport
// (Action Pause, Outcome Paused) before any handler runs: no attempt is
// counted, nothing is parked, and the messages wait in the broker.
type PauseStore struct {
	d  driver.Dialect
	ex driver.Executor
}

// NewPauseStore returns the pause store of db's tables.
func NewPauseStore(db Database) *PauseStore {
	return &PauseStore{d: db.Dialect(), ex: db.Pool()}
}

// Pause pauses consumer: from p.From (zero: at once) until p.Until (zero:
// until Resume), with p.Reason and p.By for "idem status". It replaces the
// consumer's pause, if any. p.Kind and p.Name are set from consumer; a zero
// p.At is the database's current time.
func (s *PauseStore) Pause(ctx context.Context, consumer string, p idem.Pause) error {
	if !nameRE.MatchString(consumer) {
		return fmt.Errorf("idem: inbox: pause: consumer name %q must be 1-200 letters, digits, '.', '_', ':' or '-'", consumer)
	}
	return pausewatch.Set(ctx, s.d, s.ex, idem.PauseConsumer, consumer, p)
}

// Resume removes consumer's pause, and reports whether it had one. Its
// replicas resume within Config.PauseCheck, then the transport delivers
// again what waited.
func (s *PauseStore) Resume(ctx context.Context, consumer string) (bool, error) {
	return pausewatch.Delete(ctx, s.d, s.ex, idem.PauseConsumer, consumer)
}

// List returns the pauses of every consumer of the database, ended ones
// included (see idem.Pause.ActiveAt), sorted by consumer name.
func (s *PauseStore) List(ctx context.Context) ([]idem.Pause, error) {
	return pausewatch.List(ctx, s.d, s.ex, idem.PauseConsumer)
}

// Pauses returns the consumer's pause store.
func (c *Consumer[TTx]) Pauses() *PauseStore { return NewPauseStore(c.drv) }

// handBack answers every item Pause while an operator's pause is in force,
// and reports whether it did. The transport delivers the messages again
// after RetryAfter, at most Config.PauseCheck, when the consumer reads its
// pause again.
func (c *Consumer[TTx]) handBack(ctx context.Context, items []item, disps []Disposition) bool {
	_, wait, paused := c.pauses.Check(ctx)
	if !paused {
		return false
	}
	for i := range items {
		disps[i] = Disposition{Action: Pause, Outcome: Paused, RetryAfter: wait, Event: items[i].ev}
	}
	c.stats.operatorPaused.Add(uint64(len(items)))
	return true
}
