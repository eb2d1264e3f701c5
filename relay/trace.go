package relay

import (
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/relay/internal/sendspan"
)

// TracerName is the instrumentation scope of the relay's spans.
const TracerName = "github.com/idem-go/idem/relay"

// newTracing returns the relay's OpenTelemetry instrumentation: a producer
// span per published message (see relay/internal/sendspan).
func newTracing(cfg Config, pub broker.Publisher) sendspan.Tracer {
	return sendspan.New(TracerName, cfg.TracerProvider, cfg.Propagator, pub)
}
