package relay

import (
	"context"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/ctxsleep"
	"github.com/idem-go/idem/internal/pausewatch"
)

// PauseCheck is how often a relay, polling or log (relay/cdc,
// relay/binlog), reads its operator's pause from its database: a pause
// takes effect within PauseCheck on every replica, and a resume is seen
// within it.
const PauseCheck = pausewatch.Interval

// Database is a database's dialect and pool, as every driver.Driver gives
// them.
type Database interface {
	Dialect() driver.Dialect
	Pool() driver.Executor
}

// PauseStore keeps the operators' pauses of the relays of a database, in
// its consumer_pause table (Tables.ConsumerPause, migration 0015): what
// "idem pause --relay" and "idem resume --relay" and the dashboard write.
// A relay's pause is named after the outbox table it relays
// (Tables.Outbox, without its schema), and holds every relay of that
// outbox, polling or log, on every replica, through restarts. While it is
// in force the relay claims and publishes nothing and keeps its position:
// the polling relay leaves the rows in the outbox, a log relay leaves its
// position unconfirmed (the server keeps the log from there). Rows already
// handed to the broker finish.
type PauseStore struct {
	d  driver.Dialect
	ex driver.Executor
}

// NewPauseStore returns the pause store of db's tables.
func NewPauseStore(db Database) *PauseStore {
	return &PauseStore{d: db.Dialect(), ex: db.Pool()}
}

// Pause pauses the relays of outbox: from p.From (zero: at once) until
// p.Until (zero: until Resume), with p.Reason and p.By for "idem status".
// It replaces that outbox's pause, if any.
func (s *PauseStore) Pause(ctx context.Context, outbox string, p idem.Pause) error {
	if err := (idem.Tables{Outbox: outbox}).WithDefaults().Validate(); err != nil {
		return fmt.Errorf("idem: relay: pause: %w", err)
	}
	return pausewatch.Set(ctx, s.d, s.ex, idem.PauseRelay, outbox, p)
}

// Resume removes the pause of outbox's relays, and reports whether there
// was one. They publish again within PauseCheck.
func (s *PauseStore) Resume(ctx context.Context, outbox string) (bool, error) {
	return pausewatch.Delete(ctx, s.d, s.ex, idem.PauseRelay, outbox)
}

// List returns the pauses of every outbox of the database, ended ones
// included (see idem.Pause.ActiveAt), sorted by outbox name.
func (s *PauseStore) List(ctx context.Context) ([]idem.Pause, error) {
	return pausewatch.List(ctx, s.d, s.ex, idem.PauseRelay)
}

// waitUnpaused returns at once while no operator's pause holds the relay,
// else when it ends; false when the relay stops first.
func (r *Relay[TTx]) waitUnpaused(ctx context.Context) bool {
	w := r.pauses.Load()
	for w != nil {
		_, wait, paused := w.Check(ctx)
		if !paused {
			return true
		}
		r.stats.pausedRounds.Add(1)
		if !ctxsleep.Sleep(ctx, wait) {
			return false
		}
	}
	return true
}

// pauseLoop reads the relay's pause once per PauseCheck until Stop, while
// the workers wait for rows too: Stats and health show a pause while the
// outbox is quiet.
func (r *Relay[TTx]) pauseLoop() {
	for {
		_, wait, _ := r.pauses.Load().Check(r.claimCtx)
		if !ctxsleep.Sleep(r.claimCtx, wait) {
			return
		}
	}
}
