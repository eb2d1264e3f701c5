package registry

import (
	"flag"
	"io"
	"testing"
)

// A flag given wins over its variable; a flag left out takes it.
func TestFlagsResolve(t *testing.T) {
	env := map[string]string{"IDEM_DB_URL": "postgres://env/db", "IDEM_SCHEMA": "env_schema", "IDEM_BROKER_URL": "nats://env:4222"}
	getenv := func(k string) string { return env[k] }
	for _, tt := range []struct {
		args                []string
		url, schema, broker string
	}{
		{nil, "postgres://env/db", "env_schema", "nats://env:4222"},
		{[]string{"--db", "sqlite:/tmp/x", "--schema", "s", "--broker", "memory:"}, "sqlite:/tmp/x", "s", "memory:"},
		{[]string{"--schema", "s"}, "postgres://env/db", "s", "nats://env:4222"},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var db DatabaseFlags
		var br BrokerFlags
		db.Register(fs)
		br.Register(fs)
		if err := fs.Parse(tt.args); err != nil {
			t.Fatal(err)
		}
		url, schema := db.Resolve(getenv)
		if url != tt.url || schema != tt.schema {
			t.Errorf("%q: DatabaseFlags.Resolve = %q, %q; want %q, %q", tt.args, url, schema, tt.url, tt.schema)
		}
		if got := br.Resolve(getenv); got != tt.broker {
			t.Errorf("%q: BrokerFlags.Resolve = %q, want %q", tt.args, got, tt.broker)
		}
	}
}
