package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/idem-go/idem/driver"
)

// StateCopy keeps a local copy of another service's aggregate state, applying
// only newer versions: the first article's versioned upsert. Deduplication
// skips copies of the same event; the version check also ignores an older
// event that arrives after a newer one.
//
//	var orderStatus = inbox.StateCopy{Table: "order_status", Key: "order_id",
//		Columns: []string{"status"}}
//	res, err := orderStatus.Apply(ctx, drv.Dialect(), drv.Tx(tx), orderID, ev.AggregateVersion, "cancelled")
//
// The table needs a primary or unique key on Key and an integer version
// column.
type StateCopy struct {
	// Table is the copy's table, optionally schema-qualified ("shipping.order_status").
	Table string
	// Key is the column identifying the aggregate.
	Key string
	// Version is the version column. Defaults to "version".
	Version string
	// Columns are the state columns, in the order of Apply's values.
	Columns []string
}

// VersionResult reports what StateCopy.Apply did.
type VersionResult struct {
	// Applied is true when the row was inserted or updated.
	Applied bool
	// Previous is the version stored before, 0 when there was no row.
	Previous int64
	// Gap is true when the applied version skipped at least one version
	// after Previous: an event is missing or still on its way. Log and count
	// it; the version check cannot rebuild the missing event.
	Gap bool
}

// Stale reports whether the event was older than (or as old as) the stored
// state and changed nothing.
func (r VersionResult) Stale() bool { return !r.Applied }

// Apply upserts (key, version, values...) if version is newer than the stored
// one, in the transaction behind ex.
func (s StateCopy) Apply(ctx context.Context, d driver.Dialect, ex driver.Executor, key any, version int64, values ...any) (VersionResult, error) {
	if len(values) != len(s.Columns) {
		return VersionResult{}, fmt.Errorf("idem: StateCopy %s: %d values for %d columns", s.Table, len(values), len(s.Columns))
	}
	if s.Table == "" || s.Key == "" {
		return VersionResult{}, errors.New("idem: StateCopy needs Table and Key")
	}
	if name := d.Name(); name == "mysql" || name == "sqlite" {
		return s.applyLocked(ctx, name, ex, key, version, values)
	}
	query, err := s.sql(d.Name())
	if err != nil {
		return VersionResult{}, err
	}
	args := append([]any{key, version}, values...)
	var prev *int64
	err = driver.QueryRow(ctx, ex, query, args, &prev)
	if errors.Is(err, driver.ErrNotFound) {
		return VersionResult{Applied: false}, nil
	}
	if err != nil {
		return VersionResult{}, fmt.Errorf("idem: StateCopy %s: %w", s.Table, err)
	}
	res := VersionResult{Applied: true}
	if prev != nil {
		res.Previous = *prev
		res.Gap = version > *prev+1
	}
	return res, nil
}

func (s StateCopy) sql(dialect string) (string, error) {
	version := s.Version
	if version == "" {
		version = "version"
	}
	quote := func(id string) string {
		parts := strings.Split(id, ".")
		for i, p := range parts {
			parts[i] = `"` + strings.ReplaceAll(p, `"`, `""`) + `"`
		}
		return strings.Join(parts, ".")
	}
	switch dialect {
	case "postgres":
		// prev reads the stored version from the statement's snapshot. It
		// must not lock (FOR UPDATE would follow the row to the version this
		// very statement writes and see nothing); the ON CONFLICT clause
		// locks the row and checks the version on the latest one.
		table, key, ver := quote(s.Table), quote(s.Key), quote(version)
		cols := []string{key, ver}
		params := []string{"$1", "$2"}
		sets := []string{ver + " = EXCLUDED." + ver}
		for i, c := range s.Columns {
			qc := quote(c)
			cols = append(cols, qc)
			params = append(params, fmt.Sprintf("$%d", i+3))
			sets = append(sets, qc+" = EXCLUDED."+qc)
		}
		return `WITH prev AS (SELECT ` + ver + ` AS v FROM ` + table + ` WHERE ` + key + ` = $1)
INSERT INTO ` + table + ` AS cur (` + strings.Join(cols, ", ") + `) VALUES (` + strings.Join(params, ", ") + `)
ON CONFLICT (` + key + `) DO UPDATE SET ` + strings.Join(sets, ", ") + `
WHERE cur.` + ver + ` < EXCLUDED.` + ver + `
RETURNING (SELECT v FROM prev)`, nil
	}
	return "", fmt.Errorf("idem: StateCopy: dialect %q not supported yet", dialect)
}

// applyLocked is Apply for MySQL and SQLite, which cannot return the
// previous version from the upsert: it reads the stored version, locking the
// row (FOR UPDATE on MySQL; SQLite's transaction holds the database's write
// lock), then inserts or updates.
func (s StateCopy) applyLocked(ctx context.Context, dialect string, ex driver.Executor, key any, version int64, values []any) (VersionResult, error) {
	ver := cmp.Or(s.Version, "version")
	quote := func(id string) string {
		parts := strings.Split(id, ".")
		for i, p := range parts {
			if dialect == "mysql" {
				parts[i] = "`" + strings.ReplaceAll(p, "`", "``") + "`"
			} else {
				parts[i] = `"` + strings.ReplaceAll(p, `"`, `""`) + `"`
			}
		}
		return strings.Join(parts, ".")
	}
	table, qkey, qver := quote(s.Table), quote(s.Key), quote(ver)
	lock := ""
	if dialect == "mysql" {
		lock = " FOR UPDATE"
	}
	var prev int64
	err := driver.QueryRow(ctx, ex, `SELECT `+qver+` FROM `+table+` WHERE `+qkey+` = ?`+lock, []any{key}, &prev)
	switch {
	case errors.Is(err, driver.ErrNotFound):
		cols := []string{qkey, qver}
		params := []string{"?", "?"}
		for _, c := range s.Columns {
			cols = append(cols, quote(c))
			params = append(params, "?")
		}
		args := append([]any{key, version}, values...)
		if _, err := ex.Exec(ctx, `INSERT INTO `+table+` (`+strings.Join(cols, ", ")+`) VALUES (`+strings.Join(params, ", ")+`)`, args...); err != nil {
			return VersionResult{}, fmt.Errorf("idem: StateCopy %s: %w", s.Table, err)
		}
		return VersionResult{Applied: true}, nil
	case err != nil:
		return VersionResult{}, fmt.Errorf("idem: StateCopy %s: %w", s.Table, err)
	case version <= prev:
		return VersionResult{Previous: prev}, nil
	}
	sets := []string{qver + " = ?"}
	for _, c := range s.Columns {
		sets = append(sets, quote(c)+" = ?")
	}
	args := append(append([]any{version}, values...), key)
	if _, err := ex.Exec(ctx, `UPDATE `+table+` SET `+strings.Join(sets, ", ")+` WHERE `+qkey+` = ?`, args...); err != nil {
		return VersionResult{}, fmt.Errorf("idem: StateCopy %s: %w", s.Table, err)
	}
	return VersionResult{Applied: true, Previous: prev, Gap: version > prev+1}, nil
}
