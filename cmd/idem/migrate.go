package main

import (
	"context"
	"flag"
	"fmt"
	"strings"

	idemmsg "github.com/idem-go/idem"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/registry"
	"github.com/idem-go/idem/migrate"
)

// migrateCommand is "idem migrate".
func migrateCommand() *command {
	return &command{
		name:    "migrate",
		summary: "create or update idem's tables (outbox, processed_event, failed_message)",
		usage: `Usage:
  idem migrate up     [--db URL] [--schema S]   apply every pending migration (no-op when up to date)
  idem migrate down   [--db URL] [--steps N]    revert the last N migrations (default 1; 0 for all)
  idem migrate status [--db URL]                list migrations and whether each is applied
  idem migrate sql    --dialect D [--down]      print the SQL of dialect D (postgres, mysql, sqlite), no database needed
  idem migrate sql    [--db URL] [--down]       print the SQL of the database's dialect

The migrations are embedded in idem. Applied versions are recorded in
idem_schema_migration; a database migrated by a newer idem is refused.
The SQL that "migrate sql" prints is what "migrate up" (or with --down,
"migrate down --steps 0") runs, for teams that apply migrations with their
own tool; it does not record versions in idem_schema_migration.

Examples:
  IDEM_DB_URL=postgres://app@localhost/shop idem migrate up
  idem migrate sql --dialect postgres > idem.sql                 # for your own migration tool
  idem migrate sql --dialect mysql --schema shop                 # table names qualified with the database
  idem migrate sql --db postgres://localhost/shop > idem.sql`,
		setup: setupMigrate,
	}
}

// migrateOptions holds the flags of "idem migrate".
type migrateOptions struct {
	db      dbFlags
	steps   int
	down    bool
	dialect string
}

// setupMigrate declares the flags of "idem migrate" on fs and returns the
// function that runs the command.
func setupMigrate(fs *flag.FlagSet) runFunc {
	o := &migrateOptions{}
	o.db.register(fs)
	fs.IntVar(&o.steps, "steps", 1, "with down: how many migrations to revert (0: all)")
	fs.BoolVar(&o.down, "down", false, "with sql: print the down migrations")
	fs.StringVar(&o.dialect, "dialect", "", "with sql: print the SQL of this dialect ("+strings.Join(registry.DialectNames(), ", ")+") without connecting to a database")
	return o.run
}

// run runs "idem migrate" with the positional arguments args.
func (o *migrateOptions) run(ctx context.Context, e *env, args []string) error {
	if len(args) != 1 {
		return usagef("want one of up, down, status, sql")
	}
	action := args[0]
	switch action {
	case "up", "down", "status", "sql":
	default:
		return usagef("unknown action %q: want up, down, status or sql", action)
	}
	if o.dialect != "" && action != "sql" {
		return usagef("--dialect is for migrate sql; %s needs a database (--db)", action)
	}
	if action == "sql" {
		return printSQL(ctx, e, &o.db, o.dialect, o.down)
	}
	conn, err := o.db.open(ctx, e)
	if err != nil {
		return err
	}
	defer conn.Close()
	m := migrate.New(conn.SQL)
	switch action {
	case "up":
		applied, err := m.Up(ctx)
		if err != nil {
			return err
		}
		if len(applied) == 0 {
			fmt.Fprintln(e.stdout, "Already up to date.")
		}
		for _, mig := range applied {
			fmt.Fprintf(e.stdout, "Applied %04d_%s\n", mig.Version, mig.Name)
		}
	case "down":
		if o.steps < 0 {
			return usagef("--steps %d: want 0 (all) or more", o.steps)
		}
		reverted, err := m.Down(ctx, o.steps)
		if err != nil {
			return err
		}
		if len(reverted) == 0 {
			fmt.Fprintln(e.stdout, "Nothing to revert.")
		}
		for _, mig := range reverted {
			fmt.Fprintf(e.stdout, "Reverted %04d_%s\n", mig.Version, mig.Name)
		}
	case "status":
		st, err := m.Status(ctx)
		if err != nil {
			return err
		}
		for _, s := range st {
			state := "pending"
			if s.Applied {
				state = "applied"
			}
			name := s.Name
			if s.Unknown {
				name = "(unknown to this idem: upgrade idem)"
			}
			fmt.Fprintf(e.stdout, "%04d  %-8s %s\n", s.Version, state, name)
		}
	}
	return nil
}

// printSQL prints the migrations' SQL: of the named dialect, without a
// database, or else of the database's.
func printSQL(ctx context.Context, e *env, db *dbFlags, dialect string, down bool) error {
	dir := "up"
	if down {
		dir = "down"
	}
	var d driver.Dialect
	if dialect != "" {
		_, schema := db.Resolve(e.getenv)
		var err error
		if d, err = registry.NewDialect(dialect, idemmsg.Tables{Schema: schema}); err != nil {
			return usagef("--dialect: %v", err)
		}
	} else {
		if u, _ := db.Resolve(e.getenv); u == "" {
			return usagef("pass --dialect %s to print its SQL, or --db (or IDEM_DB_URL) for the database's", strings.Join(registry.DialectNames(), "|"))
		}
		conn, err := db.open(ctx, e)
		if err != nil {
			return err
		}
		defer conn.Close()
		d = conn.SQL.Dialect()
	}
	text, err := migrate.SQL(d, dir)
	if err != nil {
		return err
	}
	fmt.Fprint(e.stdout, text)
	return nil
}
