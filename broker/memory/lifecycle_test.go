package memory_test

import (
	"testing"

	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/internal/startstop/startstoptest"
)

// Start and Stop called at once from two goroutines: both return, and the
// subscriber ends (goleak in TestMain).
func TestStopRacesStart(t *testing.T) {
	t.Parallel()
	pub := memory.New()
	r := &recorder{}
	sub, err := pub.NewSubscriber(memory.SubscriberConfig{Consumer: "stock"}, r.deliver)
	if err != nil {
		t.Fatal(err)
	}
	startstoptest.StopRacesStart(t, sub)
}
