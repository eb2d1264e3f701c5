package envflag_test

import (
	"bytes"
	"flag"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/envflag"
)

// TestParse: a flag on the command line wins over its variable, a flag left
// out takes its variable's value, and a bad value names the variable.
func TestParse(t *testing.T) {
	t.Setenv("ENVFLAG_TEST_DB", "from-env")
	t.Setenv("ENVFLAG_TEST_HTTP", "from-env")
	t.Setenv("ENVFLAG_TEST_N", "many")
	env := map[string]string{"db": "ENVFLAG_TEST_DB", "http": "ENVFLAG_TEST_HTTP", "n": "ENVFLAG_TEST_N"}

	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	db := fs.String("db", "", "database")
	http := fs.String("http", "", "address")
	fs.Int("n", 0, "count")
	err := envflag.Parse(fs, []string{"--http", "from-args", "--n", "3"}, env)
	if err != nil || *db != "from-env" || *http != "from-args" {
		t.Fatalf("Parse: %v; db %q, http %q", err, *db, *http)
	}

	fs = flag.NewFlagSet("t", flag.ContinueOnError)
	fs.Int("n", 0, "count")
	if err := envflag.Parse(fs, nil, env); err == nil || !strings.Contains(err.Error(), `ENVFLAG_TEST_N="many"`) {
		t.Fatalf("Parse with a bad variable: %v, want an error naming it", err)
	}
}

// TestUsage: the usage prints head, each flag with its default and its
// variable, then tail.
func TestUsage(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(&out)
	fs.String("db", "x", "database URL:\nmore")
	fs.Duration("wait", 0, "how long")
	envflag.Usage(fs, map[string]string{"db": "T_DB"}, "HEAD\n", "TAIL\n")()
	want := "HEAD\n  --db\n        database URL:\n        more (default x) [$T_DB]\n  --wait\n        how long\nTAIL\n"
	if out.String() != want {
		t.Fatalf("usage:\n%s\nwant:\n%s", out.String(), want)
	}
}
