package broker

import (
	"fmt"
	"net/url"

	"github.com/idem-go/idem"
)

// CloudEventsParams are the broker URL parameters that turn CloudEvents on
// (CloudEventsFromURL), the same for every transport.
var CloudEventsParams = []string{"cloudevents", "cloudevents_source"}

// CloudEventsFromURL reads the parameters of a broker URL that turn a
// publisher's CloudEvents on: cloudevents=binary|structured (the content
// mode) and cloudevents_source=URI-REFERENCE (idem.CloudEvents.Source). It
// returns nil when the URL has neither, and an error naming the parameter
// when one is wrong. Each transport's ParseURL calls it, so that
// "idem relay --broker 'kafka://host:9092?cloudevents=binary'" publishes
// CloudEvents.
func CloudEventsFromURL(q url.Values) (*idem.CloudEvents, error) {
	mode, source := q.Get("cloudevents"), q.Get("cloudevents_source")
	if !q.Has("cloudevents") && !q.Has("cloudevents_source") {
		return nil, nil
	}
	ce := &idem.CloudEvents{Source: source}
	switch mode {
	case "":
		if q.Has("cloudevents") {
			return nil, fmt.Errorf("cloudevents=%q: want binary or structured", mode)
		}
		return nil, fmt.Errorf("cloudevents_source=%q without cloudevents=binary or cloudevents=structured", source)
	case "binary":
		ce.Mode = idem.CloudEventsBinary
	case "structured":
		ce.Mode = idem.CloudEventsStructured
	default:
		return nil, fmt.Errorf("cloudevents=%q: want binary or structured", mode)
	}
	if q.Has("cloudevents_source") && source == "" {
		return nil, fmt.Errorf("cloudevents_source is empty: want a URI-reference such as /shop/order, or leave it out (/idem/<aggregate type>)")
	}
	if err := ce.Validate(); err != nil {
		return nil, fmt.Errorf("cloudevents_source=%q: %w", source, err)
	}
	return ce, nil
}
