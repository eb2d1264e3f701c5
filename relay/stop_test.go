package relay_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/relay"
)

// TestStopWhileStartChecks: a Stop whose deadline passes while Start still
// reads the outbox (held here by a lock) abandons the start-up without a
// panic, and returns its deadline's error once Start has given up; the
// relay then never runs.
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
	startCtx, cancelStart := context.WithCancel(ctx)
	defer cancelStart()
	started := make(chan error, 1)
	go func() { started <- r.Start(startCtx) }()
	testsvc.WaitFor(t, 30*time.Second, "Start waiting on the outbox's lock", func() bool {
		var n int
		err := b.pg.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query ILIKE '%outbox%' AND pid <> pg_backend_pid()`).Scan(&n)
		return err == nil && n > 0
	})
	stopCtx, cancelStop := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelStop()
	stopped := make(chan error, 1)
	go func() { stopped <- r.Stop(stopCtx) }()
	<-stopCtx.Done() // Stop abandons the start-up, then waits for Start
	cancelStart()
	if err := <-started; err == nil {
		t.Error("Start returned nil after its check was cancelled")
	}
	if err := <-stopped; !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Stop = %v, want its deadline's error", err)
	}
	select {
	case <-r.Done():
	default:
		t.Error("Done is not closed after Stop returned")
	}
}
