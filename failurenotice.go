package idem

import (
	"strings"
	"time"

	"github.com/google/uuid"
)

// The names of the failure notices, as events (see FailureNotice).
const (
	// FailureMessageParked: a consumer parked a message in its failure
	// store.
	FailureMessageParked = "idem.failure.message.parked.v1"
	// FailureMessageResolved: a parked message left the failure store's
	// list: applied after a retry, removed, archived or redirected.
	FailureMessageResolved = "idem.failure.message.resolved.v1"
	// FailureRowQuarantined: a relay quarantined an outbox row: it could
	// not become a message, or the broker refused its message on every
	// attempt (FailureNotice.OutboxTable and OutboxSeq name it).
	FailureRowQuarantined = "idem.failure.outbox_row.quarantined.v1"
)

// FailureNoticePrefix starts the name of every failure notice. No notice
// is sent of a message that is itself a notice, so that notices
// that cannot be delivered never breed more of them.
const FailureNoticePrefix = "idem.failure."

// IsFailureNotice reports whether eventName is the name of a failure
// notice.
func IsFailureNotice(eventName string) bool { return strings.HasPrefix(eventName, FailureNoticePrefix) }

// The resolutions of a failure (FailureNotice.Resolution).
const (
	// ResolvedRetried: the consumer applied the message after a retry (or
	// found it applied already).
	ResolvedRetried = "retried"
	// ResolvedRemoved: an operator removed the message.
	ResolvedRemoved = "removed"
	// ResolvedArchived: an operator archived the message.
	ResolvedArchived = "archived"
	// ResolvedRedirected: an operator sent the message to another
	// consumer (FailureNotice.RedirectedTo), and it was archived.
	ResolvedRedirected = "redirected"
)

// FailureNotice tells of a message parked by a consumer, and of its
// resolution: what the hooks of inbox.Config.OnFailure and
// inbox.FailureStore.WithFailureHook receive, in the transaction that
// parks or resolves it, and what outbox.FailureEvents writes as an event
// named Name, so that other services can subscribe to failures.
//
// The hooks receive the message's body and headers; the events of
// outbox.FailureEvents leave them out unless told otherwise
// (outbox.FailureEventsConfig.Body).
type FailureNotice struct {
	// Name is the notice's event name: FailureMessageParked,
	// FailureMessageResolved or FailureRowQuarantined.
	Name string `json:"notice"`
	// At is when it happened.
	At time.Time `json:"at"`
	// Consumer is the consumer name.
	Consumer string `json:"consumer,omitempty"`
	// OutboxTable and OutboxSeq name the quarantined outbox row of a
	// FailureRowQuarantined notice: its table (without its schema) and its
	// seq ("idem failed show --relay SEQ").
	OutboxTable string `json:"outbox_table,omitempty"`
	OutboxSeq   int64  `json:"outbox_seq,omitempty"`
	// Source is the queue, topic or subject the message came from.
	Source string `json:"source,omitempty"`
	// FailedMessageID is the failure store entry's id.
	FailedMessageID int64 `json:"failed_message_id,omitempty"`
	// Class is the kind of failure, as "idem failed groups" shows it:
	// undecodable, permanent, exhausted or held.
	Class string `json:"class,omitempty"`
	// Group is the id of the failure's group ("idem failed groups"): the
	// same for every failure of one cause.
	Group string `json:"group,omitempty"`
	// EventID, EventName, AggregateType and AggregateID are the event's,
	// when known.
	EventID       uuid.UUID `json:"event_id"`
	EventName     string    `json:"event_name,omitempty"`
	AggregateType string    `json:"aggregate_type,omitempty"`
	AggregateID   string    `json:"aggregate_id,omitempty"`
	// HeldBy is the parked message this one waits behind, if any.
	HeldBy int64 `json:"held_by,omitempty"`
	// Attempts is the number of failed attempts.
	Attempts int `json:"attempts,omitempty"`
	// Error is the last error's text.
	Error string `json:"error,omitempty"`
	// Resolution, in a resolved notice, is ResolvedRetried,
	// ResolvedRemoved, ResolvedArchived or ResolvedRedirected.
	Resolution string `json:"resolution,omitempty"`
	// RedirectedTo is the consumer a redirected message was sent to.
	RedirectedTo string `json:"redirected_to,omitempty"`
	// By is who resolved it, when an operator did and said who.
	By string `json:"by,omitempty"`
	// Headers and Body are the message's, as the failure store holds it,
	// for the hooks; outbox.FailureEvents leaves them out of its events
	// unless told otherwise.
	Headers map[string]string `json:"headers,omitempty"`
	Body    []byte            `json:"body,omitempty"`
}
