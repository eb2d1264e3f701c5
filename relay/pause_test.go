package relay_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/relay"
)

// TestRelayOperatorPause: a relay whose outbox an operator paused claims
// nothing (its workers hold back, counted), stays healthy, shows the pause
// in Stats and stops while paused leaving the rows waiting; once resumed
// it publishes them. Its Stop is the sentinel: once it returns, nothing
// more is published.
func TestRelayOperatorPause(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := testsvc.Ctx(t, time.Minute)
	pauses := relay.NewPauseStore(b.pg.Driver)
	if err := pauses.Pause(ctx, "outbox", idem.Pause{Reason: "broker upgrade", By: "ops"}); err != nil {
		t.Fatal(err)
	}
	b.insert(t, event(t, "1", 1))

	r, err := relay.New(b.pg.Driver, b.pub, fastConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	testsvc.WaitFor(t, 30*time.Second, "the relay's workers held by the pause", func() bool {
		s := r.Stats()
		return s.Paused != nil && s.Paused.Reason == "broker upgrade" && s.PausedRounds >= 2
	})
	if err := r.Healthy(); err != nil {
		t.Errorf("a paused relay is unhealthy: %v", err)
	}
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := r.Stop(stopCtx); err != nil {
		t.Fatalf("stop while paused: %v", err)
	}
	if n := b.pub.Len(); n != 0 {
		t.Fatalf("a paused relay published %d messages", n)
	}
	if s := r.Stats(); s.Claims+s.EmptyClaims != 0 {
		t.Errorf("a paused relay claimed: %+v", s)
	}
	if n := b.pg.Count(t, "outbox WHERE published_at IS NULL"); n != 1 {
		t.Fatalf("%d rows waiting after a paused relay stopped, want 1", n)
	}

	// Resumed: a new relay, paused at first, publishes once the pause is
	// removed, within PauseCheck.
	if err := pauses.Pause(ctx, "outbox", idem.Pause{Reason: "broker upgrade", By: "ops"}); err != nil {
		t.Fatal(err)
	}
	r = b.start(t, fastConfig(t))
	testsvc.WaitFor(t, 30*time.Second, "the new relay paused", func() bool { return r.Stats().PausedRounds >= 1 })
	ps, err := pauses.List(ctx)
	if err != nil || len(ps) != 1 || ps[0].Kind != idem.PauseRelay || ps[0].Name != "outbox" || ps[0].By != "ops" {
		t.Fatalf("List = %+v, %v; want the outbox's pause", ps, err)
	}
	if ok, err := pauses.Resume(ctx, "outbox"); !ok || err != nil {
		t.Fatalf("Resume = %v, %v; want true, nil", ok, err)
	}
	if err := b.pub.WaitLen(testsvc.Ctx(t, 30*time.Second), 1); err != nil {
		t.Fatal(err)
	}
	testsvc.WaitFor(t, 30*time.Second, "the pause seen ended", func() bool { return r.Stats().Paused == nil })
	if ok, err := pauses.Resume(ctx, "outbox"); ok || err != nil {
		t.Errorf("a second Resume = %v, %v; want false, nil", ok, err)
	}
	if err := pauses.Pause(ctx, "out box", idem.Pause{}); err == nil {
		t.Error("a pause of an outbox named \"out box\" was accepted")
	}
}

// TestRelayWithoutPauseTable: a database without the table of pauses (not
// migrated to 0015, or a role that may not read it): the relay says so at
// start and relays as before, and its Stats, read all along, show no pause
// (the race detector checks them against Start).
func TestRelayWithoutPauseTable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.pg.Exec(t, `DROP TABLE consumer_pause`)
	var logs syncBuffer
	cfg := fastConfig(t)
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	r, err := relay.New(b.pg.Driver, b.pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		for {
			select {
			case <-done:
				return
			default:
			}
			if s := r.Stats(); s.Paused != nil {
				t.Errorf("Stats().Paused = %+v without a table of pauses", s.Paused)
				return
			}
		}
	}()
	if err := r.Start(testsvc.Ctx(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	b.insert(t, event(t, "1", 1))
	if err := b.pub.WaitLen(testsvc.Ctx(t, 30*time.Second), 1); err != nil {
		t.Fatal(err)
	}
	close(done)
	<-ended
	if !strings.Contains(logs.String(), "cannot be paused") {
		t.Errorf("no warning that the relay cannot be paused:\n%s", logs.String())
	}
}
