package relay

import (
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
)

// RecordMessage returns the message the relay publishes for an outbox row,
// or an error (a *driver.UnreadableError) when the row cannot become one: the
// rules of every relay, the CDC relay (relay/cdc) included, so that a row
// written by another program is published, or refused, the same way
// whichever relay reads it.
func RecordMessage(rec driver.OutboxRecord) (idem.Message, error) { return toMessage(rec) }
