package postgres

import "github.com/idem-go/idem/driver/internal/dialectkit"

// StatusStatements returns the statements of ReadStatus, for the test of
// their plans.
func StatusStatements(d *Dialect) dialectkit.StatusSQL { return d.status }
