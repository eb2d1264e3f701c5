package relay_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/relay"
)

// TestStopWhileStartChecks: a Stop while Start still reads the outbox
// (held here by a lock) ends the start-up at once, without a panic: Start
// returns idem.ErrStopped, Stop returns nil, and the relay never runs.
func TestStopWhileStartChecks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, err := relay.New(b.pg.Driver, b.pub, fastConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testsvc.Ctx(t, time.Minute)
	lock, err := b.pg.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(context.Background()) }()
	if _, err := lock.Exec(ctx, `LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 1)
	go func() { started <- r.Start(ctx) }()
	testsvc.WaitFor(t, 30*time.Second, "Start waiting on the outbox's lock", func() bool {
		var n int
		err := b.pg.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query ILIKE '%outbox%' AND pid <> pg_backend_pid()`).Scan(&n)
		return err == nil && n > 0
	})
	if err := r.Stop(ctx); err != nil {
		t.Errorf("Stop = %v, want nil", err)
	}
	if err := <-started; !errors.Is(err, idem.ErrStopped) {
		t.Errorf("Start = %v, want idem.ErrStopped", err)
	}
	select {
	case <-r.Done():
	default:
		t.Error("Done is not closed after Stop returned")
	}
	if err := r.Start(ctx); !errors.Is(err, idem.ErrStopped) {
		t.Errorf("Start after Stop = %v, want idem.ErrStopped", err)
	}
}
