package driver

import "context"

// ConsumerCounter is the part of a Dialect that counts, cheaply, what waits
// in a consumer's database: its parked messages and the events it is
// retrying. inbox.Consumer.FailureCounts and the consumer metrics
// (inbox/inboxmetrics) read it.
type ConsumerCounter interface {
	// ConsumerCounts counts consumer's rows in failed_message, and its
	// rows in delivery_attempt whose event has no processed_event marker
	// (an event applied by another process after failing leaves a row
	// until the purge: it is not waiting). Both are index range scans on
	// the consumer's name.
	ConsumerCounts(ctx context.Context, ex Executor, consumer string) (ConsumerCounts, error)
}

// ConsumerCounts is what waits in a consumer's database.
type ConsumerCounts struct {
	// Parked counts the consumer's messages in the failure store, those
	// parked behind an earlier one of their aggregate included.
	Parked int64
	// Retrying counts the events that failed at least once (an attempt
	// counted in delivery_attempt) and are neither applied nor parked yet:
	// the consumer's retry backlog.
	Retrying int64
}
