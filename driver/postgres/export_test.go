package postgres

import (
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver/internal/dialectkit"
)

// StatusStatements returns the statements of ReadStatus on tables, for the
// test of their plans.
func StatusStatements(tables idem.Tables) dialectkit.StatusSQL {
	t := tables.WithDefaults()
	n := dialectkit.TableNames(t, QuoteIdent)
	return newStatusSQL(n.Outbox, n.ProcessedEvent, n.FailedMessage, n.DeliveryAttempt)
}
