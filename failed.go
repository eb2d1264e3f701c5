package idem

import (
	"time"

	"github.com/google/uuid"
)

// AggregateRef names one aggregate: its type and id, as in the outbox's
// aggregatetype and aggregateid.
type AggregateRef struct {
	// Type is the aggregate type ("order").
	Type string
	// ID is the aggregate id ("42").
	ID string
}

// FailedMessage is an entry of the failure store: a received message kept
// exactly as it arrived, with why and how often it failed. Every field reads
// back byte for byte as it was saved, whatever bytes it holds. The store
// holds one entry per parked message: two messages with the same event id
// are two entries.
type FailedMessage struct {
	// ID identifies the entry; ids grow in the order entries are created
	// and are never reused. On a save, 0 adds an entry and an entry's id
	// records one more failure of that entry, whose message stays as it
	// was first stored.
	ID int64
	// Consumer is the consumer name.
	Consumer string
	// Source is the queue, topic or subject the message came from.
	Source string
	// EventID is the event id; uuid.Nil when the message was undecodable.
	EventID uuid.UUID
	// EventName is the event name, when known.
	EventName string
	// AggregateType and AggregateID name the event's aggregate, when
	// known. Messages of one aggregate are handled in order: a later one
	// waits behind a parked one (see HeldBy).
	AggregateType string
	AggregateID   string
	// HeldBy is the id of the parked message of the same aggregate that
	// this one waits behind; 0 for a message parked for its own failure.
	HeldBy int64
	// Key is the message key (Kafka), as received.
	Key []byte
	// Headers are the message headers, as received.
	Headers map[string]string
	// Body is the message body, as received.
	Body []byte
	// Error is the last error.
	Error string
	// History lists every failure saved for the entry, oldest first.
	History []FailureRecord
	// Attempts is the number of failed attempts, over every save.
	Attempts int
	// FirstFailed and LastFailed are when the entry was created and last
	// saved.
	FirstFailed time.Time
	LastFailed  time.Time
	// Original is the message as it was received, when an operator edited
	// the entry (Body and Headers then hold the edited message, which a
	// retry sends); nil for an entry never edited.
	Original *FailedOriginal
	// Archived is when an operator archived the entry: kept, listed only
	// when asked for (FailedFilter.Archived), holding no aggregate. Zero for
	// an entry that is not archived; an archived entry parked again (its
	// retry failed, or a copy of it failed) is not archived any more.
	Archived time.Time
	// Actions lists what operators did to the entry (edit, retry,
	// redirect, archive), oldest first: the entry's audit trail.
	Actions []FailedAction
}

// FailedOriginal is a parked message as it was received, kept when an
// operator edits the entry.
type FailedOriginal struct {
	// Headers are the message headers, as received.
	Headers map[string]string
	// Body is the message body, as received.
	Body []byte
}

// The actions of an operator on a failure store entry (FailedAction.Action).
const (
	// FailedEdit: the body or headers were changed (FailedOriginal keeps
	// the message as received).
	FailedEdit = "edit"
	// FailedRetry: the entry was sent back to the queue it came from.
	FailedRetry = "retry"
	// FailedRedirect: the entry was sent to another consumer, and archived.
	FailedRedirect = "redirect"
	// FailedArchive: the entry was archived.
	FailedArchive = "archive"
)

// FailedAction is one action of an operator on a failure store entry, as
// its audit trail records it.
type FailedAction struct {
	// At is when it was done.
	At time.Time `json:"at"`
	// Action is FailedEdit, FailedRetry, FailedRedirect or FailedArchive.
	Action string `json:"action"`
	// By is who did it: a user name, as the command or dashboard was told
	// or authenticated it; empty when unknown.
	By string `json:"by"`
	// Detail says more: what an edit changed, the consumer of a redirect.
	Detail string `json:"detail,omitempty"`
}

// FailureRecord is one failed attempt in a FailedMessage's history.
type FailureRecord struct {
	At      time.Time `json:"at"`
	Attempt int       `json:"attempt"`
	Error   string    `json:"error"`
}

// FailedFilter selects entries of the failure store. Zero fields match all.
type FailedFilter struct {
	// Consumer matches the consumer name exactly.
	Consumer string
	// EventName matches the event name exactly.
	EventName string
	// AggregateType and AggregateID match the aggregate exactly (each
	// when not empty).
	AggregateType string
	AggregateID   string
	// HeldBy, when positive, matches the messages waiting behind that
	// parked message.
	HeldBy int64
	// Since matches messages that last failed at or after it.
	Since time.Time
	// BeforeID and AfterID, when positive, match ids below and above them:
	// the cursor of the next page (the last id of the previous one).
	BeforeID, AfterID int64
	// Archived selects the archived entries instead of the others: the
	// store lists either, never both at once.
	Archived bool
	// Oldest lists oldest first (ascending ids) instead of newest first.
	Oldest bool
	// Limit is the most entries returned. For inbox.FailureStore.List, 0
	// means all (it pages through them); dialects always receive a
	// positive page size.
	Limit int
}

// NextPage returns f with the cursor set past last, the last entry of a page
// listed with f: the filter of the next page.
func (f FailedFilter) NextPage(last FailedMessage) FailedFilter {
	if f.Oldest {
		f.AfterID = last.ID
	} else {
		f.BeforeID = last.ID
	}
	return f
}
