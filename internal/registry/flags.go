package registry

import (
	"context"
	"flag"

	"github.com/idem-go/idem"
)

// DatabaseFlags are the --db and --schema flags of a command that opens
// idem's tables: idem's commands and the benchmarks. A flag left empty
// takes its environment variable, IDEM_DB_URL or IDEM_SCHEMA (Resolve).
type DatabaseFlags struct {
	// URL is --db, the database URL; Schema is --schema, the schema that
	// holds idem's tables.
	URL, Schema string
}

// Register declares --db and --schema on fs.
func (f *DatabaseFlags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.URL, "db", "", "database URL (default $IDEM_DB_URL):\n"+DatabaseURLHelp())
	fs.StringVar(&f.Schema, "schema", "", "schema holding idem's tables (default $IDEM_SCHEMA, else the connection's search_path)")
}

// Resolve returns the database URL and the schema: each flag's value, or
// when it is empty its variable, read with getenv (os.Getenv, or a test's
// environment).
func (f *DatabaseFlags) Resolve(getenv func(string) string) (url, schema string) {
	url, schema = f.URL, f.Schema
	if url == "" {
		url = getenv("IDEM_DB_URL")
	}
	if schema == "" {
		schema = getenv("IDEM_SCHEMA")
	}
	return url, schema
}

// Open opens the database that Resolve names, with idem's tables in its
// schema.
func (f *DatabaseFlags) Open(ctx context.Context, getenv func(string) string) (*Database, error) {
	url, schema := f.Resolve(getenv)
	return OpenDatabase(ctx, url, DatabaseOptions{Tables: idem.Tables{Schema: schema}})
}

// BrokerFlags is the --broker flag of a command that publishes: idem's
// relays and the benchmarks. Left empty, it takes IDEM_BROKER_URL
// (Resolve).
type BrokerFlags struct {
	// URL is --broker, the broker URL.
	URL string
}

// Register declares --broker on fs.
func (f *BrokerFlags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.URL, "broker", "", "broker URL (default $IDEM_BROKER_URL):\n"+BrokerURLHelp())
}

// Resolve returns the broker URL: the flag's value, or when it is empty
// IDEM_BROKER_URL, read with getenv.
func (f *BrokerFlags) Resolve(getenv func(string) string) string {
	if f.URL != "" {
		return f.URL
	}
	return getenv("IDEM_BROKER_URL")
}
