package idempotency_test

import (
	"database/sql"
	"testing"
	"time"

	"github.com/idem-go/idem/idempotency"
	"github.com/idem-go/idem/internal/startstop/startstoptest"
	"github.com/idem-go/idem/internal/testdb"
)

// Start and Stop called at once from two goroutines: both return, and the
// purger ends.
func TestPurgerStopRacesStart(t *testing.T) {
	t.Parallel()
	s := testdb.NewSQLite(t)
	app := newWidgets(t, testDB[*sql.Tx]{drv: s.Driver, dialect: "sqlite"}, idempotency.Config{TTL: time.Hour, PurgeInterval: time.Millisecond})
	startstoptest.StopRacesStart(t, app.keys.NewPurger())
}
