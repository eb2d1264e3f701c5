package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
)

// UpsertVersioned implements driver.Dialect in one statement: INSERT ... ON
// CONFLICT DO UPDATE ... WHERE the stored version is older, returning the
// version read before. A stale version updates nothing and returns no row:
// the stored version is then read, for Previous.
func (d *dialect) UpsertVersioned(ctx context.Context, ex driver.Executor, p driver.UpsertVersionedParams) (driver.UpsertVersionedResult, error) {
	table, key, ver := quoteQualified(p.Table), QuoteIdent(p.KeyColumn), QuoteIdent(p.VersionColumn)
	cols := []string{key, ver}
	params := []string{"$1", "$2"}
	sets := []string{ver + " = EXCLUDED." + ver}
	for i, c := range p.Columns {
		qc := QuoteIdent(c)
		cols = append(cols, qc)
		params = append(params, fmt.Sprintf("$%d", i+3))
		sets = append(sets, qc+" = EXCLUDED."+qc)
	}
	// prev reads the stored version from the statement's snapshot. It must
	// not lock (FOR UPDATE would follow the row to the version this very
	// statement writes and see nothing); the ON CONFLICT clause locks the
	// row and checks the version on the latest one.
	query := `WITH prev AS (SELECT ` + ver + ` AS v FROM ` + table + ` WHERE ` + key + ` = $1)
INSERT INTO ` + table + ` AS cur (` + strings.Join(cols, ", ") + `) VALUES (` + strings.Join(params, ", ") + `)
ON CONFLICT (` + key + `) DO UPDATE SET ` + strings.Join(sets, ", ") + `
WHERE cur.` + ver + ` < EXCLUDED.` + ver + `
RETURNING (SELECT v FROM prev)`
	var prev *int64
	err := driver.QueryRow(ctx, ex, query, append([]any{p.Key, p.Version}, p.Values...), &prev)
	if errors.Is(err, idem.ErrNotFound) {
		var stored int64
		err := driver.QueryRow(ctx, ex, `SELECT `+ver+` FROM `+table+` WHERE `+key+` = $1`, []any{p.Key}, &stored)
		return driver.UpsertVersionedResult{Previous: stored}, d.Wrap(err)
	}
	if err != nil {
		return driver.UpsertVersionedResult{}, d.Wrap(err)
	}
	res := driver.UpsertVersionedResult{Applied: true}
	if prev != nil {
		res.Previous = *prev
	}
	return res, nil
}

// quoteQualified quotes each dot-separated part of name.
func quoteQualified(name string) string {
	parts := strings.Split(name, ".")
	for i, p := range parts {
		parts[i] = QuoteIdent(p)
	}
	return strings.Join(parts, ".")
}
