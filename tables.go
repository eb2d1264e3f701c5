package idem

import (
	"fmt"
	"regexp"
)

// Default table names.
const (
	OutboxTableDefault          = "outbox"
	ProcessedEventTableDefault  = "processed_event"
	FailedMessageTableDefault   = "failed_message"
	DeliveryAttemptTableDefault = "delivery_attempt"
	MigrationTableDefault       = "idem_schema_migration"
	// IdempotentRequestTableDefault is not "idempotency_key", the name
	// applications that wrote their own key store tend to use, so that
	// migration 0004 never collides with such a table.
	IdempotentRequestTableDefault = "idempotent_request"
	// ConsumerMemberTableDefault and ConsumerPartitionTableDefault are the
	// tables of the ownership groups of consumers (inbox.Group).
	ConsumerMemberTableDefault    = "consumer_member"
	ConsumerPartitionTableDefault = "consumer_partition"
	// BinlogPositionTableDefault is the table of the binlog relays'
	// positions (MySQL and MariaDB; relay/binlog).
	BinlogPositionTableDefault = "binlog_position"
	// OutboxArchiveTableDefault is the table where the CDC relays keep the
	// events they published, for replays (relay/cdc, relay/binlog).
	OutboxArchiveTableDefault = "outbox_archive"
	// ConsumerPauseTableDefault is the table of the operators' pauses of
	// consumers and relays (Pause).
	ConsumerPauseTableDefault = "consumer_pause"
)

// Tables names the tables idem uses. Every name is optional; the zero value
// means the defaults in the connection's default schema.
type Tables struct {
	// Schema is the schema (PostgreSQL) or database (MySQL) holding the
	// tables. Empty means the connection's current one (search_path).
	Schema string
	// Outbox defaults to "outbox".
	Outbox string
	// ProcessedEvent defaults to "processed_event".
	ProcessedEvent string
	// FailedMessage defaults to "failed_message".
	FailedMessage string
	// DeliveryAttempt is the table counting the failed attempts of events
	// not yet applied nor parked. Defaults to "delivery_attempt".
	DeliveryAttempt string
	// Migrations is the table recording applied migrations. Defaults to
	// "idem_schema_migration".
	Migrations string
	// IdempotentRequest is the table of the idempotency keys of incoming
	// requests (package idempotency). Defaults to "idempotent_request".
	IdempotentRequest string
	// ConsumerMember is the table of the live members of consumers'
	// ownership groups (inbox.Group). Defaults to "consumer_member".
	ConsumerMember string
	// ConsumerPartition is the table of the partition leases of
	// consumers' ownership groups. Defaults to "consumer_partition".
	ConsumerPartition string
	// BinlogPosition is the table where the binlog relays of MySQL and
	// MariaDB (relay/binlog) keep their positions, one row per outbox.
	// Defaults to "binlog_position".
	BinlogPosition string
	// OutboxArchive is the table where the CDC relays (relay/cdc,
	// relay/binlog) keep the events they published, for "idem replay": one
	// row per event and outbox, the outbox's table name in its outbox_table
	// column (PostgreSQL and MySQL/MariaDB, migration 0013). Defaults to
	// "outbox_archive".
	OutboxArchive string
	// ConsumerPause is the table of the operators' pauses of the
	// consumers and relays of this database (Pause, migration 0015).
	// Defaults to "consumer_pause".
	ConsumerPause string
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]{0,62}$`)

// WithDefaults returns t with empty names replaced by the defaults.
func (t Tables) WithDefaults() Tables {
	if t.Outbox == "" {
		t.Outbox = OutboxTableDefault
	}
	if t.ProcessedEvent == "" {
		t.ProcessedEvent = ProcessedEventTableDefault
	}
	if t.FailedMessage == "" {
		t.FailedMessage = FailedMessageTableDefault
	}
	if t.DeliveryAttempt == "" {
		t.DeliveryAttempt = DeliveryAttemptTableDefault
	}
	if t.Migrations == "" {
		t.Migrations = MigrationTableDefault
	}
	if t.IdempotentRequest == "" {
		t.IdempotentRequest = IdempotentRequestTableDefault
	}
	if t.ConsumerMember == "" {
		t.ConsumerMember = ConsumerMemberTableDefault
	}
	if t.ConsumerPartition == "" {
		t.ConsumerPartition = ConsumerPartitionTableDefault
	}
	if t.BinlogPosition == "" {
		t.BinlogPosition = BinlogPositionTableDefault
	}
	if t.OutboxArchive == "" {
		t.OutboxArchive = OutboxArchiveTableDefault
	}
	if t.ConsumerPause == "" {
		t.ConsumerPause = ConsumerPauseTableDefault
	}
	return t
}

// Validate checks that every name is a plain SQL identifier (letters, digits,
// underscores, at most 63 characters). Names are quoted in SQL anyway; the rule
// keeps them portable across dialects and safe in index and channel names.
func (t Tables) Validate() error {
	t = t.WithDefaults()
	for _, f := range []struct{ field, v string }{
		{"Schema", t.Schema}, {"Outbox", t.Outbox}, {"ProcessedEvent", t.ProcessedEvent},
		{"FailedMessage", t.FailedMessage}, {"DeliveryAttempt", t.DeliveryAttempt}, {"Migrations", t.Migrations},
		{"IdempotentRequest", t.IdempotentRequest}, {"ConsumerMember", t.ConsumerMember},
		{"ConsumerPartition", t.ConsumerPartition}, {"BinlogPosition", t.BinlogPosition}, {"OutboxArchive", t.OutboxArchive},
		{"ConsumerPause", t.ConsumerPause},
	} {
		if f.field == "Schema" && f.v == "" {
			continue
		}
		if !identRE.MatchString(f.v) {
			return fmt.Errorf("idem: Tables.%s %q is not a valid identifier (letters, digits and _; at most 63 characters; not starting with a digit)", f.field, f.v)
		}
	}
	return nil
}
