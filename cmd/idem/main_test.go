package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	idemmsg "github.com/idem-go/idem"

	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/version"
)

// idem runs the CLI in-process and returns its exit code and outputs.
func idem(t *testing.T, environ map[string]string, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	e := &env{stdout: &out, stderr: &errOut, stdin: strings.NewReader(stdin), getenv: func(k string) string { return environ[k] }}
	code := run(context.Background(), e, args)
	return code, out.String(), errOut.String()
}

func TestMigrateCommand(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t, testdb.Options{NoMigrate: true})
	env := map[string]string{"IDEM_DB_URL": pg.URL}

	code, out, errOut := idem(t, env, "", "migrate", "up")
	if code != 0 || !strings.Contains(out, "Applied 0001_idem_tables") {
		t.Fatalf("migrate up = %d\n%s%s", code, out, errOut)
	}
	code, out, _ = idem(t, env, "", "migrate", "up")
	if code != 0 || !strings.Contains(out, "Already up to date") {
		t.Fatalf("second migrate up = %d %q", code, out)
	}
	code, out, _ = idem(t, nil, "", "migrate", "status", "--db", pg.URL)
	if code != 0 || !strings.Contains(out, "0001  applied") {
		t.Fatalf("migrate status = %d %q", code, out)
	}
	code, out, _ = idem(t, env, "", "migrate", "sql")
	if code != 0 || !strings.Contains(out, `CREATE TABLE "outbox"`) {
		t.Fatalf("migrate sql = %d %q", code, out)
	}
	migs := postgres.MustDialect(idemmsg.Tables{}).Migrations()
	last := migs[len(migs)-1]
	code, out, _ = idem(t, env, "", "migrate", "down", "--steps", "1")
	if want := fmt.Sprintf("Reverted %04d_%s", last.Version, last.Name); code != 0 || !strings.Contains(out, want) || strings.Contains(out, "Reverted 0001") {
		t.Fatalf("migrate down --steps 1 = %d %q, want the latest migration (%s) reverted only", code, out, want)
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
		code int
	}{
		{[]string{"migrate"}, "want one of up, down, status, sql", 2},
		{[]string{"migrate", "sideways", "--db", "postgres://x"}, `unknown action "sideways"`, 2},
		{[]string{"migrate", "up"}, "pass --db, --db-file FILE or set IDEM_DB_URL", 1},
		{[]string{"migrate", "up", "--db", "mongodb://x"}, `scheme "mongodb" is not supported`, 1},
		{[]string{"migrate", "up", "--bogus"}, "flag provided but not defined: -bogus", 2},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`, 2},
		{[]string{"purge", "--older-than", "7d", "--replay-window", "30d", "--db", "postgres://x"}, "", 1},
		{[]string{"purge", "--older-than", "soon", "--replay-window", "30d"}, `--older-than "soon"`, 2},
	} {
		code, _, errOut := idem(t, nil, "", tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("idem %v = %d %q; want %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
}

func TestPurgeCommandRefusesShortHorizon(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	pg.Exec(t, `INSERT INTO processed_event (consumer_name, event_id, processed_at) VALUES ('stock', gen_random_uuid(), now() - interval '40 days')`)
	env := map[string]string{"IDEM_DB_URL": pg.URL}
	code, _, errOut := idem(t, env, "", "purge", "--older-than", "7d", "--replay-window", "30d")
	if code != 1 || !strings.Contains(errOut, "shorter than the replay window") {
		t.Fatalf("purge = %d %q", code, errOut)
	}
	code, out, errOut := idem(t, env, "", "purge", "--older-than", "31d", "--replay-window", "30d")
	if code != 0 || !strings.Contains(out, "Deleted 1 marker(s)") {
		t.Fatalf("purge = %d %q %q", code, out, errOut)
	}
}

func TestPurgeCommandFailedMessages(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	for i, age := range []string{"40 days", "40 days", "1 hour"} {
		pg.Exec(t, `INSERT INTO failed_message (consumer_name, source, body, error, attempts, first_failed_at, failed_at)
VALUES ('stock', 'stock.events', $1, 'boom', 1, now() - $2::interval, now() - $2::interval)`, []byte(fmt.Sprint(i)), age)
	}
	pg.Exec(t, `INSERT INTO processed_event (consumer_name, event_id, processed_at) VALUES ('stock', gen_random_uuid(), now() - interval '40 days')`)
	env := map[string]string{"IDEM_DB_URL": pg.URL}
	code, _, errOut := idem(t, env, "", "purge", "--replay-window", "30d")
	if code != 2 || !strings.Contains(errOut, "--failed-older-than") {
		t.Fatalf("purge without a horizon = %d %q", code, errOut)
	}
	// A refused horizon deletes nothing, whichever comes first.
	code, _, errOut = idem(t, env, "", "purge", "--older-than", "31d", "--failed-older-than", "7d", "--replay-window", "30d")
	if code != 1 || !strings.Contains(errOut, "shorter than the replay window") {
		t.Fatalf("purge = %d %q", code, errOut)
	}
	if pg.Count(t, "processed_event")+pg.Count(t, "failed_message") != 4 {
		t.Fatal("a refused purge deleted rows")
	}
	code, out, errOut := idem(t, env, "", "purge", "--failed-older-than", "31d", "--replay-window", "30d", "--consumer", "stock")
	if code != 0 || !strings.Contains(out, "Deleted 2 parked message(s) of consumer stock") || strings.Contains(out, "marker") {
		t.Fatalf("purge --failed-older-than = %d %q %q", code, out, errOut)
	}
	if pg.Count(t, "failed_message") != 1 || pg.Count(t, "processed_event") != 1 {
		t.Fatal("purge --failed-older-than deleted the wrong rows")
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	code, out, _ := idem(t, nil, "", "help", "migrate")
	if code != 0 || !strings.Contains(out, "Examples:") || !strings.Contains(out, "-db") {
		t.Fatalf("help migrate = %d %q", code, out)
	}
	code, out, _ = idem(t, nil, "", "purge", "--help")
	if code != 0 || !strings.Contains(out, "replay window") || !strings.Contains(out, "--failed-older-than deletes the messages of the failure store") {
		t.Fatalf("purge --help = %d %q", code, out)
	}
	code, out, _ = idem(t, nil, "")
	if code != 0 || !strings.Contains(out, "migrate") {
		t.Fatalf("idem = %d %q", code, out)
	}
	// The images' binaries print the version scripts/image.sh stamps
	// (deploy's TestRelayImage).
	code, out, _ = idem(t, nil, "", "version")
	if want := version.Line("idem") + "\n"; code != 0 || out != want {
		t.Fatalf("idem version = %d %q, want %q", code, out, want)
	}
}

// TestCommandTable: the table lists each command once, in the order "idem
// help" shows (by name), each with a summary and a usage, and "idem help"
// lists every one.
func TestCommandTable(t *testing.T) {
	t.Parallel()
	_, overview, _ := idem(t, nil, "", "help")
	for i, c := range commands {
		if i > 0 && commands[i-1].name >= c.name {
			t.Errorf("command %q after %q: keep the table sorted by name", c.name, commands[i-1].name)
		}
		if c.summary == "" || !strings.Contains(c.usage, "Usage:") || c.setup == nil {
			t.Errorf("command %q: want a summary, a usage and a setup", c.name)
		}
		if lookup(c.name) != c || !strings.Contains(overview, "  "+c.name+" ") {
			t.Errorf("command %q: not found by lookup or not in idem help:\n%s", c.name, overview)
		}
	}
}
