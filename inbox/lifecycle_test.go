package inbox

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/startstop/startstoptest"
	"github.com/idem-go/idem/internal/testdb"
)

// holdDriver is a driver whose statements never end before their context:
// a database that does not answer. held is closed at the first statement.
type holdDriver struct {
	driver.Driver[*sql.Tx]
	held chan struct{}
	once *sync.Once
}

func newHoldDriver(drv driver.Driver[*sql.Tx]) holdDriver {
	return holdDriver{Driver: drv, held: make(chan struct{}), once: new(sync.Once)}
}

func (d holdDriver) Pool() driver.Executor { return holdExec(d) }

type holdExec holdDriver

func (e holdExec) Exec(ctx context.Context, _ string, _ ...any) (int64, error) {
	e.once.Do(func() { close(e.held) })
	<-ctx.Done()
	return 0, ctx.Err()
}

func (e holdExec) Query(ctx context.Context, _ string, _ ...any) (driver.Rows, error) {
	e.once.Do(func() { close(e.held) })
	<-ctx.Done()
	return nil, ctx.Err()
}

// A Stop while Start waits for the database ends the start-up: Start
// fails, Stop returns, nothing leaks.
func TestGroupStopDuringStart(t *testing.T) {
	db := testdb.NewSQLite(t)
	startstoptest.StopDuringStart(t, func(t *testing.T) (startstoptest.Service, <-chan struct{}) {
		drv := newHoldDriver(db.Driver)
		c, err := New[*sql.Tx](drv, Config{Name: "stock"})
		if err != nil {
			t.Fatal(err)
		}
		g, err := NewGroup(c, GroupConfig{Partitions: 2, Subscriber: func(int) (broker.Subscriber, error) { return nil, errAway }})
		if err != nil {
			t.Fatal(err)
		}
		return g, drv.held
	})
}

// A purge that does not end holds Stop until Stop's context ends: Stop
// then returns its error at once, the purge is cancelled, and Done closes
// once it has returned.
func TestPurgerStopOutOfTimeCancelsThePurge(t *testing.T) {
	drv := newHoldDriver(testdb.NewSQLite(t).Driver)
	p, err := NewPurger[*sql.Tx](drv, PurgerConfig{
		Markers:  PurgeConfig{Consumer: "stock", Horizon: 31 * 24 * time.Hour, ReplayWindow: 30 * 24 * time.Hour},
		Interval: time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-drv.held
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := p.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop during a purge that does not end: %v, want DeadlineExceeded", err)
	}
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the cancelled purge did not end")
	}
	if err := p.Start(context.Background()); !errors.Is(err, idem.ErrStopped) {
		t.Fatalf("Start after Stop: %v, want idem.ErrStopped", err)
	}
}

// Start and Stop called at once from two goroutines: both return, and the
// purger ends.
func TestPurgerStopRacesStart(t *testing.T) {
	p, err := NewPurger[*sql.Tx](testdb.NewSQLite(t).Driver, PurgerConfig{
		Markers: PurgeConfig{Consumer: "stock", Horizon: 31 * 24 * time.Hour, ReplayWindow: 30 * 24 * time.Hour},
	})
	if err != nil {
		t.Fatal(err)
	}
	startstoptest.StopRacesStart(t, p)
}
