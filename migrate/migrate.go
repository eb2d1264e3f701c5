// Package migrate applies idem's versioned schema migrations (outbox,
// processed_event, failed_message). The migrations are embedded in each dialect
// package, rendered for the configured table names; the migrator records the
// applied versions in a table of its own, serialises concurrent runs, and
// refuses to touch a database whose schema is newer than it knows.
//
// The idem CLI exposes it as "idem migrate up|down|status|sql". Teams with
// their own migration tool print the SQL with SQL and apply it themselves.
package migrate

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/idem-go/idem/driver"
)

// ErrSchemaNewer is returned when the database has migrations applied that this
// version of idem does not know: it was migrated by a newer idem.
var ErrSchemaNewer = errors.New("idem: database schema is newer than this idem version; upgrade idem")

// Migrator applies migrations through a driver.
type Migrator[TTx any] struct {
	drv driver.Driver[TTx]
}

// New returns a migrator for drv's dialect and tables.
func New[TTx any](drv driver.Driver[TTx]) *Migrator[TTx] {
	return &Migrator[TTx]{drv: drv}
}

// Status is the state of one migration.
type Status struct {
	Version int
	Name    string
	Applied bool
	// Unknown is true for a version recorded in the database that this idem
	// version does not have.
	Unknown bool
}

// Up applies every migration not yet applied, in version order, and returns
// those it applied. On an up-to-date database it does nothing.
func (m *Migrator[TTx]) Up(ctx context.Context) ([]driver.Migration, error) {
	var applied []driver.Migration
	err := m.inLock(ctx, func(ex driver.Executor, done map[int]bool) error {
		for _, mig := range m.drv.Dialect().Migrations() {
			if done[mig.Version] {
				continue
			}
			vctx, err := m.versionContext(ctx)
			if err != nil {
				return err
			}
			if err := execScript(vctx, ex, m.drv.Dialect().MigrationSupport(), mig.Up); err != nil {
				return fmt.Errorf("idem: migration %04d_%s up: %w", mig.Version, mig.Name, err)
			}
			if _, err := ex.Exec(vctx, m.drv.Dialect().MigrationSupport().InsertVersion, mig.Version, mig.Name); err != nil {
				return fmt.Errorf("idem: record migration %04d: %w", mig.Version, err)
			}
			applied = append(applied, mig)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return applied, nil
}

// Down reverts the steps most recent applied migrations (all of them when
// steps <= 0) and returns those it reverted, newest first.
func (m *Migrator[TTx]) Down(ctx context.Context, steps int) ([]driver.Migration, error) {
	var reverted []driver.Migration
	err := m.inLock(ctx, func(ex driver.Executor, done map[int]bool) error {
		migs := m.drv.Dialect().Migrations()
		for i := len(migs) - 1; i >= 0; i-- {
			mig := migs[i]
			if !done[mig.Version] {
				continue
			}
			if steps > 0 && len(reverted) == steps {
				break
			}
			vctx, err := m.versionContext(ctx)
			if err != nil {
				return err
			}
			if err := execScript(vctx, ex, m.drv.Dialect().MigrationSupport(), mig.Down); err != nil {
				return fmt.Errorf("idem: migration %04d_%s down: %w", mig.Version, mig.Name, err)
			}
			if _, err := ex.Exec(vctx, m.drv.Dialect().MigrationSupport().DeleteVersion, mig.Version); err != nil {
				return fmt.Errorf("idem: forget migration %04d: %w", mig.Version, err)
			}
			reverted = append(reverted, mig)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return reverted, nil
}

// versionContext returns the context one version runs under. Where DDL
// does not roll back (MySQL), a version stopped between two statements would
// stay half applied and unrecorded: once begun it runs to its end, without
// ctx's cancellation; ctx is checked between versions. Where DDL is
// transactional, a cancellation rolls everything back, and ctx is used as
// is.
func (m *Migrator[TTx]) versionContext(ctx context.Context) (context.Context, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if m.drv.Dialect().MigrationSupport().TransactionalDDL {
		return ctx, nil
	}
	return context.WithoutCancel(ctx), nil
}

// Status lists every known migration and whether it is applied, followed by
// any applied version this idem does not know.
func (m *Migrator[TTx]) Status(ctx context.Context) ([]Status, error) {
	var out []Status
	err := m.inLockAllowNewer(ctx, func(_ driver.Executor, done map[int]bool) error {
		known := map[int]bool{}
		for _, mig := range m.drv.Dialect().Migrations() {
			known[mig.Version] = true
			out = append(out, Status{Version: mig.Version, Name: mig.Name, Applied: done[mig.Version]})
		}
		for v := range done {
			if !known[v] {
				out = append(out, Status{Version: v, Applied: true, Unknown: true})
			}
		}
		return nil
	})
	return out, err
}

// SQL returns the SQL of every migration in the given direction ("up" or
// "down"), in the order it would run, with a comment before each.
func SQL(d driver.Dialect, direction string) (string, error) {
	migs := d.Migrations()
	var b strings.Builder
	switch direction {
	case "up":
		for _, mig := range migs {
			fmt.Fprintf(&b, "-- %04d_%s (up)\n%s\n", mig.Version, mig.Name, strings.TrimSpace(mig.Up))
		}
	case "down":
		for i := len(migs) - 1; i >= 0; i-- {
			mig := migs[i]
			fmt.Fprintf(&b, "-- %04d_%s (down)\n%s\n", mig.Version, mig.Name, strings.TrimSpace(mig.Down))
		}
	default:
		return "", fmt.Errorf("idem: migration direction %q: want \"up\" or \"down\"", direction)
	}
	return b.String(), nil
}

func (m *Migrator[TTx]) inLock(ctx context.Context, fn func(driver.Executor, map[int]bool) error) error {
	return m.run(ctx, false, fn)
}

func (m *Migrator[TTx]) inLockAllowNewer(ctx context.Context, fn func(driver.Executor, map[int]bool) error) error {
	return m.run(ctx, true, fn)
}

func (m *Migrator[TTx]) run(ctx context.Context, allowNewer bool, fn func(driver.Executor, map[int]bool) error) (err error) {
	sup := m.drv.Dialect().MigrationSupport()
	bctx := ctx
	if !sup.TransactionalDDL {
		// database/sql rolls a transaction back when its context ends: the
		// transaction must outlive a cancellation, for the version in
		// progress to finish (see versionContext).
		bctx = context.WithoutCancel(ctx)
	}
	tx, err := m.drv.Begin(bctx)
	if err != nil {
		return fmt.Errorf("idem: migrate: begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = m.drv.Rollback(ctx, tx)
		}
	}()
	ex := m.drv.Tx(tx)
	var unlock func() error
	if sup.Lock != "" && sup.Unlock != "" {
		// A session-level lock (MySQL): taken and released on the
		// transaction's connection, since DDL commits the transaction.
		var taken *int64
		if err := driver.QueryRow(ctx, ex, sup.Lock, nil, &taken); err != nil {
			return fmt.Errorf("idem: migrate: lock: %w", err)
		}
		if taken == nil || *taken != 1 {
			return errors.New("idem: migrate: lock: another migration holds the lock; try again when it is done")
		}
		unlock = func() error {
			unlock = nil
			_, err := ex.Exec(context.WithoutCancel(ctx), sup.Unlock)
			return err
		}
		defer func() {
			if unlock != nil {
				_ = unlock()
			}
		}()
	} else if sup.Lock != "" {
		if _, err := ex.Exec(ctx, sup.Lock); err != nil {
			return fmt.Errorf("idem: migrate: lock: %w", err)
		}
	}
	if _, err := ex.Exec(ctx, sup.CreateTable); err != nil {
		return fmt.Errorf("idem: migrate: create migrations table: %w", err)
	}
	done, err := m.applied(ctx, ex)
	if err != nil {
		return err
	}
	if !allowNewer {
		known := map[int]bool{}
		for _, mig := range m.drv.Dialect().Migrations() {
			known[mig.Version] = true
		}
		for v := range done {
			if !known[v] {
				return fmt.Errorf("%w (version %d is applied)", ErrSchemaNewer, v)
			}
		}
	}
	if err := fn(ex, done); err != nil {
		return err
	}
	if unlock != nil {
		if err := unlock(); err != nil {
			return fmt.Errorf("idem: migrate: unlock: %w", err)
		}
	}
	if err := m.drv.Commit(ctx, tx); err != nil {
		if cerr := ctx.Err(); cerr != nil {
			// database/sql rolls back a transaction whose context ends, and
			// its Commit then reports only that the transaction is done:
			// say why.
			return fmt.Errorf("idem: migrate: %w (commit: %v)", cerr, err)
		}
		return fmt.Errorf("idem: migrate: commit: %w", err)
	}
	return nil
}

// execScript runs a migration script: in one call when the dialect has
// transactional DDL, else one statement at a time.
func execScript(ctx context.Context, ex driver.Executor, sup driver.MigrationSupport, script string) error {
	if sup.TransactionalDDL {
		_, err := ex.Exec(ctx, script)
		return err
	}
	for _, stmt := range SplitStatements(script) {
		if _, err := ex.Exec(ctx, stmt); err != nil {
			return err
		}
	}
	return nil
}

func (m *Migrator[TTx]) applied(ctx context.Context, ex driver.Executor) (map[int]bool, error) {
	done := map[int]bool{}
	err := driver.QueryRows(ctx, ex, m.drv.Dialect().MigrationSupport().SelectVersions, nil, func(rows driver.Rows) error {
		var v int
		if err := rows.Scan(&v); err != nil {
			return err
		}
		done[v] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("idem: migrate: read applied versions: %w", err)
	}
	return done, nil
}

// SplitStatements splits a migration script into its statements: a statement
// ends with a semicolon at the end of a line. Lines holding only a "--"
// comment are dropped. Scripts of dialects without transactional DDL are run
// one statement at a time with it, since their drivers do not run several
// statements in one call by default.
func SplitStatements(script string) []string {
	var (
		out []string
		cur strings.Builder
	)
	for line := range strings.SplitSeq(script, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(trimmed, ";") {
			if stmt := strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"); stmt != "" {
				out = append(out, stmt)
			}
			cur.Reset()
		}
	}
	if stmt := strings.TrimSpace(cur.String()); stmt != "" {
		out = append(out, stmt)
	}
	return out
}
