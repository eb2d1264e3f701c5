package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testdb"
)

// TestPauseCommands: idem pause and idem resume record and remove the
// pauses of a consumer and of a relay where they read them; --list and
// idem status (screen and JSON) show them with their window, reason and
// author, an operator's text shown inert; bad flags say which and why.
func TestPauseCommands(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	env := map[string]string{"USER": "alice"}
	run := func(args ...string) string {
		t.Helper()
		code, out, errOut := idem(t, env, "", append(args, "--db", pg.URL)...)
		if code != 0 {
			t.Fatalf("idem %s = %d\n%s%s", strings.Join(args, " "), code, out, errOut)
		}
		return out
	}
	from, until := time.Now().Add(time.Hour).UTC(), time.Now().Add(3*time.Hour).UTC()
	out := run("pause", "shipping", "--from", from.Format(time.RFC3339), "--until", until.Format(time.RFC3339), "--reason", "carrier\x1b[31m maintenance")
	if !strings.Contains(out, "paused the consumer shipping from ") || !strings.Contains(out, "idem resume shipping") {
		t.Errorf("pause said %q", out)
	}
	out = run("pause", "--relay", "--for", "30m", "--reason", "broker upgrade", "--by", "bob")
	if !strings.Contains(out, "paused the relay outbox from now") || !strings.Contains(out, "idem resume --relay") {
		t.Errorf("pause --relay said %q", out)
	}
	out = run("pause", "--list")
	for _, want := range []string{"consumer  shipping  scheduled", "alice", `"carrier\x1b[31m maintenance"`, "relay     outbox    active", "bob", "broker upgrade"} {
		if !strings.Contains(out, want) {
			t.Errorf("pause --list lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b") {
		t.Errorf("pause --list printed an escape character:\n%q", out)
	}
	out = run("status")
	for _, want := range []string{"paused consumer shipping: scheduled, from ", "paused relay outbox: active, until ", "by bob (broker upgrade); idem resume --relay"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	var doc struct {
		Pauses []struct {
			Kind, Name, Reason, By string
			Active                 bool
			Until                  *time.Time
		}
	}
	if err := json.Unmarshal([]byte(run("status", "--json")), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Pauses) != 2 || doc.Pauses[0].Kind != "consumer" || doc.Pauses[0].Active || doc.Pauses[1].Name != "outbox" ||
		!doc.Pauses[1].Active || doc.Pauses[1].Until == nil || doc.Pauses[1].By != "bob" {
		t.Errorf("status --json pauses = %+v", doc.Pauses)
	}

	if out := run("resume", "--relay"); !strings.Contains(out, "resumed the relay outbox") {
		t.Errorf("resume --relay said %q", out)
	}
	if out := run("resume", "--relay"); !strings.Contains(out, "was not paused") {
		t.Errorf("a second resume said %q", out)
	}
	if out := run("resume", "shipping"); !strings.Contains(out, "resumed the consumer shipping") {
		t.Errorf("resume said %q", out)
	}
	if out := run("pause", "--list"); !strings.Contains(out, "no pauses") {
		t.Errorf("pause --list after the resumes: %q", out)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"pause"}, "name the consumer"},
		{[]string{"pause", "a", "b"}, "one consumer at a time"},
		{[]string{"pause", "a", "--until", "2h", "--for", "1h"}, "not both"},
		{[]string{"pause", "a", "--until", "tomorrow"}, `--until "tomorrow": want an RFC 3339 time`},
		{[]string{"pause", "a", "--until", "2020-01-01"}, "is not in the future"},
		{[]string{"pause", "a", "--from", "3h", "--until", "2h"}, "is not after from"},
		{[]string{"pause", "bad name"}, "consumer name"},
		{[]string{"pause", "--relay", "out-box"}, "out-box"},
		{[]string{"pause", "--list", "a"}, "--list takes no name"},
	} {
		code, out, errOut := idem(t, env, "", append(c.args, "--db", pg.URL)...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("idem %s = %d, %q%q; want a failure saying %q", strings.Join(c.args, " "), code, out, errOut, c.want)
		}
	}
}
