package envflag_test

import (
	"bytes"
	"flag"
	"io"
	"os"
	"path/filepath"
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

// TestFileFlag: --NAME-file sets --NAME from the file without its trailing
// newline, wins over the variable, repeats for a repeatable flag, and is
// refused with --NAME; an empty or missing file is an error naming it.
func TestFileFlag(t *testing.T) {
	t.Setenv("ENVFLAG_TEST_DB", "from-env")
	env := map[string]string{"db": "ENVFLAG_TEST_DB"}
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	crlf, lf, empty := write("crlf", "postgres://u:S3cret@db/x\r\n"), write("lf", "amqp://u:S3cret@mq/\n"), write("empty", "\n")

	newFS := func() (*flag.FlagSet, *string, *[]string) {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		db := fs.String("db", "", "database")
		var list []string
		fs.Func("broker", "repeatable", func(v string) error { list = append(list, v); return nil })
		envflag.FileFlag(fs, "db")
		envflag.FileFlag(fs, "broker")
		return fs, db, &list
	}
	fs, db, list := newFS()
	if err := envflag.Parse(fs, []string{"--db-file", crlf, "--broker-file", lf, "--broker-file", crlf}, env); err != nil {
		t.Fatal(err)
	}
	if *db != "postgres://u:S3cret@db/x" || len(*list) != 2 || (*list)[0] != "amqp://u:S3cret@mq/" {
		t.Fatalf("db %q, broker %q", *db, *list)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--db", "x", "--db-file", lf}, "--db and --db-file both given"},
		{[]string{"--db-file", empty}, "--db-file: " + empty + " is empty"},
		{[]string{"--db-file", filepath.Join(dir, "missing")}, "no such file"},
	} {
		fs, _, _ := newFS()
		err := envflag.Parse(fs, tc.args, env)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "S3cret") {
			t.Errorf("Parse(%q) = %v, want an error with %q and no secret", tc.args, err, tc.want)
		}
	}
}
