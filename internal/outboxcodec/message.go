package outboxcodec

import (
	"cmp"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
)

// columns names the outbox columns behind the envelope's fields, for the
// errors of rows that cannot become messages.
var columns = map[string]string{
	"event_id":          "id",
	"event_name":        "type (the event name)",
	"aggregate_type":    "aggregatetype",
	"aggregate_id":      "aggregateid",
	"aggregate_version": "aggregate_version",
	"payload":           "payload",
	"content_type":      "content_type",
}

// Message returns the message a relay publishes for an outbox row, or an
// error (a *driver.UnreadableError) when the row cannot become one. Every
// relay (polling, CDC) uses it, so that a row written by another program is
// published, or refused, the same way whichever relay reads it. The
// message's event id is rec.ID; when it was derived from an id that is not
// a UUID (idem.EventID), the message carries that id, rec.RawID, in the
// header idem.HeaderOriginalID.
func Message(rec driver.OutboxRecord) (idem.Message, error) {
	if rec.Unreadable != nil {
		return idem.Message{}, rec.Unreadable
	}
	headers := rec.Headers
	if rec.RawID != "" && idem.IsDerivedEventID(rec.RawID) {
		headers = make(map[string]string, len(rec.Headers)+1)
		for k, v := range rec.Headers {
			headers[k] = v
		}
		headers[idem.HeaderOriginalID] = rec.RawID
	}
	msg, err := idem.NewMessage(idem.Event{
		ID:               rec.ID,
		Name:             rec.Type,
		OccurredAt:       rec.OccurredAt,
		AggregateType:    rec.AggregateType,
		AggregateID:      rec.AggregateID,
		AggregateVersion: rec.AggregateVersion,
		ContentType:      rec.ContentType,
		Payload:          rec.Payload,
		Headers:          headers,
	})
	if err != nil {
		var fe *idem.FieldError
		if errors.As(err, &fe) {
			err = fmt.Errorf("%s %s", cmp.Or(columns[fe.Field], fe.Field), fe.Problem)
		}
		return idem.Message{}, &driver.UnreadableError{Seq: rec.Seq, Problems: []error{err}}
	}
	return msg, nil
}
