// Package versioned implements driver.Dialect.UpsertVersioned for the
// dialects that cannot return the previous version from an upsert (MySQL,
// SQLite): they read the stored version, locking the row, then insert or
// update. On MySQL a key that is not stored yet is inserted without a
// locking read (see Flavor.IsDuplicateKey).
package versioned

import (
	"context"
	"errors"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
)

// Flavor is what differs between the dialects.
type Flavor struct {
	// Quote quotes one identifier.
	Quote func(string) string
	// Lock ends the read of the stored version (" FOR UPDATE" on MySQL;
	// empty on SQLite, where the transaction holds the database's write
	// lock).
	Lock string
	// IsDuplicateKey, when set, reports a duplicate-key error, and Upsert
	// locks only a row that exists: it reads the stored version without a
	// lock first, and inserts a key it does not find. A locking read of a
	// missing key would lock the gap where the key goes (InnoDB under
	// REPEATABLE READ); two transactions inserting new keys into one gap,
	// as the workers of a consumer do for new aggregates, would then
	// deadlock. A key inserted by another transaction since this one's
	// snapshot fails the insert as a duplicate, and is then read with the
	// lock.
	IsDuplicateKey func(error) bool
}

// QuoteQualified quotes each dot-separated part of name.
func (f Flavor) QuoteQualified(name string) string {
	parts := strings.Split(name, ".")
	for i, p := range parts {
		parts[i] = f.Quote(p)
	}
	return strings.Join(parts, ".")
}

// Upsert implements driver.Dialect.UpsertVersioned with ? placeholders.
func (f Flavor) Upsert(ctx context.Context, ex driver.Executor, p driver.UpsertVersionedParams) (driver.UpsertVersionedResult, error) {
	table, key, ver := f.QuoteQualified(p.Table), f.Quote(p.KeyColumn), f.Quote(p.VersionColumn)
	read := func(lock string) (prev int64, err error) {
		err = driver.QueryRow(ctx, ex, `SELECT `+ver+` FROM `+table+` WHERE `+key+` = ?`+lock, []any{p.Key}, &prev)
		return prev, err
	}
	insert := func() error {
		cols := []string{key, ver}
		params := []string{"?", "?"}
		for _, c := range p.Columns {
			cols = append(cols, f.Quote(c))
			params = append(params, "?")
		}
		args := append([]any{p.Key, p.Version}, p.Values...)
		_, err := ex.Exec(ctx, `INSERT INTO `+table+` (`+strings.Join(cols, ", ")+`) VALUES (`+strings.Join(params, ", ")+`)`, args...)
		return err
	}
	if f.IsDuplicateKey != nil {
		_, err := read("")
		switch {
		case errors.Is(err, idem.ErrNotFound):
			err := insert()
			if err == nil {
				return driver.UpsertVersionedResult{Applied: true}, nil
			}
			if !f.IsDuplicateKey(err) {
				return driver.UpsertVersionedResult{}, err
			}
			// Inserted by another transaction since this one's snapshot:
			// read it again, locked.
		case err != nil:
			return driver.UpsertVersionedResult{}, err
		}
	}
	prev, err := read(f.Lock)
	switch {
	case errors.Is(err, idem.ErrNotFound):
		if err := insert(); err != nil {
			return driver.UpsertVersionedResult{}, err
		}
		return driver.UpsertVersionedResult{Applied: true}, nil
	case err != nil:
		return driver.UpsertVersionedResult{}, err
	case p.Version <= prev:
		return driver.UpsertVersionedResult{Previous: prev}, nil
	}
	sets := []string{ver + " = ?"}
	for _, c := range p.Columns {
		sets = append(sets, f.Quote(c)+" = ?")
	}
	args := append(append([]any{p.Version}, p.Values...), p.Key)
	if _, err := ex.Exec(ctx, `UPDATE `+table+` SET `+strings.Join(sets, ", ")+` WHERE `+key+` = ?`, args...); err != nil {
		return driver.UpsertVersionedResult{}, err
	}
	return driver.UpsertVersionedResult{Applied: true, Previous: prev}, nil
}
