package inbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
)

func TestRetryPolicy(t *testing.T) {
	t.Parallel()
	p := inbox.RetryPolicy{Jitter: -1}.WithDefaults()
	if p.MaxAttempts() != 4 {
		t.Errorf("default attempts = %d, want 4 (3 retries, as Symfony Messenger)", p.MaxAttempts())
	}
	for attempt, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 10: time.Minute} {
		if got := p.Delay(attempt); got != want {
			t.Errorf("Delay(%d) = %v, want %v", attempt, got, want)
		}
	}
	j := inbox.RetryPolicy{}.WithDefaults()
	for range 100 {
		if d := j.Delay(1); d < 900*time.Millisecond || d > 1100*time.Millisecond {
			t.Fatalf("jittered delay %v outside 1s ±10%%", d)
		}
	}
	if (inbox.RetryPolicy{MaxRetries: -1}).Retry(1) {
		t.Error("MaxRetries -1 must not retry")
	}
}

// A Purger purges on its own, every Interval, until Stop.
func TestPurgerPurgesUntilStopped(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	ctx := context.Background()
	for range 5 {
		pg.Exec(t, `INSERT INTO processed_event (consumer_name, event_id, processed_at) VALUES ('stock', $1, now() - interval '40 days')`, idem.NewEventID())
	}
	if _, err := inbox.NewPurger(pg.Driver, inbox.PurgerConfig{Markers: inbox.PurgeConfig{Horizon: time.Hour, ReplayWindow: 24 * time.Hour}}); !errors.Is(err, inbox.ErrHorizonTooShort) {
		t.Fatalf("NewPurger with a horizon under the replay window: %v, want ErrHorizonTooShort", err)
	}
	p, err := inbox.NewPurger(pg.Driver, inbox.PurgerConfig{
		Markers:  inbox.PurgeConfig{Consumer: "stock", Horizon: 31 * 24 * time.Hour, ReplayWindow: 30 * 24 * time.Hour},
		Interval: 20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	testsvc.WaitFor(t, 10*time.Second, "old markers purged", func() bool { return pg.Count(t, "processed_event") == 0 })
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	default:
		t.Fatal("Done not closed after Stop")
	}
	if err := p.Start(ctx); err == nil {
		t.Fatal("a stopped purger started again")
	}
}
