package inbox

import (
	"context"
	"errors"
	"fmt"
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
// were parked: what "idem failed retry ID" does. Each message sent is
// recorded in its entry's audit trail, unless the consumer applied it and
// removed the entry first. report, when not nil, is
// called after each message with Redrive's result. Retry returns how many
// messages were sent and how many were not; err is an error reading the
// store, which stops it.
func (s *FailureStore) Retry(ctx context.Context, rd broker.Redeliverer, m idem.FailedMessage, report func(idem.FailedMessage, error)) (sent, failed int, err error) {
	one := func(m idem.FailedMessage) bool {
		err := s.redrive(ctx, rd, m)
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

// redrive re-drives m (Redrive) and records it in the entry's audit trail.
// A failure to record it is not the re-drive's: the message is sent.
func (s *FailureStore) redrive(ctx context.Context, rd broker.Redeliverer, m idem.FailedMessage) error {
	if err := Redrive(ctx, rd, m); err != nil {
		return err
	}
	_ = s.record(ctx, m.ID, idem.FailedAction{Action: idem.FailedRetry, By: s.by, Detail: "to " + m.Source})
	return nil
}

// ErrNoConsumerPublisher is returned by Redirect for a broker that cannot
// send a message to one consumer only (broker.ConsumerPublisher): Kafka,
// whose consumer groups all read one topic, and the webhook handlers.
var ErrNoConsumerPublisher = errors.New("idem: inbox: this broker cannot send a message to one consumer only (it is not a broker.ConsumerPublisher)")

// Redirect sends the message of m to consumer instead of the consumer that
// parked it, then archives m, with the redirect in its audit trail and,
// with a FailureHook, a notice of its resolution (idem.ResolvedRedirected).
// The message goes as a plain delivery to that consumer only (pub's
// PublishToConsumer): same body (as edited, if it was), headers, key, event
// id and name, without the re-drive mark, which names an entry of another
// consumer. That consumer deduplicates it on its event id as any message:
// an event it applied already is skipped. If it fails there, that
// consumer parks it in its own store. The messages held behind m stay
// where they are, as after a removal: its aggregate is released. A
// redirect to m's own consumer is refused: Retry sends it back there.
func (s *FailureStore) Redirect(ctx context.Context, pub broker.ConsumerPublisher, m idem.FailedMessage, consumer string) error {
	if pub == nil {
		return ErrNoConsumerPublisher
	}
	switch consumer {
	case "":
		return errors.New("idem: inbox: redirect: no consumer given")
	case m.Consumer:
		return fmt.Errorf("idem: inbox: redirect %d to %s: it is that consumer's message already; retry it instead", m.ID, consumer)
	}
	headers := make(map[string]string, len(m.Headers))
	for k, v := range m.Headers {
		if k != idem.HeaderRedrive && k != idem.HeaderAttempt {
			headers[k] = v
		}
	}
	msg := idem.Message{EventID: m.EventID, EventName: m.EventName, AggregateType: m.AggregateType, Key: m.Key, Headers: headers, Body: m.Body}
	if err := pub.PublishToConsumer(ctx, consumer, []idem.Message{msg}); err != nil {
		return fmt.Errorf("idem: inbox: redirect %d to %s: %w", m.ID, consumer, err)
	}
	a := idem.FailedAction{Action: idem.FailedRedirect, By: s.by, Detail: "to consumer " + consumer}
	if _, err := s.archive(ctx, m.ID, a, idem.ResolvedRedirected, consumer); err != nil {
		return fmt.Errorf("idem: inbox: redirect %d to %s: sent, but not archived: %w", m.ID, consumer, err)
	}
	return nil
}
