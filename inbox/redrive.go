package inbox

import (
	"context"
	"errors"
	"maps"
	"strconv"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
)

// ErrUnknownSource is returned by Redrive for a parked message whose
// source (the queue, topic or subject it came from) was not recorded:
// there is nowhere to send it back to.
var ErrUnknownSource = errors.New("idem: inbox: the queue the message came from is unknown; it cannot be re-driven")

// Redrive publishes a parked message again through rd, to the one queue it
// came from (m.Source), unchanged: same body, key, event id and name, its
// headers plus idem.HeaderRedrive holding its failure-store id. The
// consumer lets it through the messages parked after it, removes its entry
// once it is applied (or found applied already), and parks it again in the
// same entry if it fails again (one entry per message: attempts added,
// history appended, the stored bytes kept, without the header). This is
// what "idem failed retry" does for each message; the entry stays in the
// store until the consumer acts.
func Redrive(ctx context.Context, rd broker.Redeliverer, m idem.FailedMessage) error {
	if m.Source == "" {
		return ErrUnknownSource
	}
	headers := make(map[string]string, len(m.Headers)+1)
	maps.Copy(headers, m.Headers)
	headers[idem.HeaderRedrive] = strconv.FormatInt(m.ID, 10)
	msg := idem.Message{EventID: m.EventID, EventName: m.EventName, Key: m.Key, Headers: headers, Body: m.Body}
	return rd.Redeliver(ctx, m.Source, []idem.Message{msg})
}

// Retry re-drives m (Redrive) and, once it is sent, the messages held
// behind it (parked after it, of the same aggregate), in the order they
// were parked: what "idem failed retry ID" does. report, when not nil, is
// called after each message with Redrive's result. Retry returns how many
// messages were sent and how many were not; err is an error reading the
// store, which stops it.
func (s *FailureStore) Retry(ctx context.Context, rd broker.Redeliverer, m idem.FailedMessage, report func(idem.FailedMessage, error)) (sent, failed int, err error) {
	one := func(m idem.FailedMessage) bool {
		err := Redrive(ctx, rd, m)
		if report != nil {
			report(m, err)
		}
		if err != nil {
			failed++
			return false
		}
		sent++
		return true
	}
	if !one(m) {
		return sent, failed, nil
	}
	held := idem.FailedFilter{HeldBy: m.ID, Oldest: true, Limit: FailedPageSizeDefault}
	err = s.Pages(ctx, held, func(page []idem.FailedMessage) error {
		for _, h := range page {
			one(h)
		}
		return nil
	})
	return sent, failed, err
}
