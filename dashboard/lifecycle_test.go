package dashboard_test

import (
	"testing"
	"time"

	"github.com/idem-go/idem/dashboard"
	"github.com/idem-go/idem/internal/startstop/startstoptest"
)

// Start and Stop called at once from two goroutines: both return, and the
// sampling ends (goleak in TestMain).
func TestStopRacesStart(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *dashboard.Config) { c.SampleInterval = time.Millisecond })
	startstoptest.StopRacesStart(t, b.d)
}
