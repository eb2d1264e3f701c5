package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// runBench runs the command in-process and returns its exit status and outputs.
func runBench(t *testing.T, environ map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	e := &env{stdout: &out, stderr: &errOut, getenv: func(k string) string { return environ[k] }}
	code := run(context.Background(), e, args)
	return code, out.String(), errOut.String()
}

// TestUsage checks the help and the command line errors, none of which
// needs a server.
func TestUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{nil, {"help"}, {"--help"}, {"relay", "--help"}} {
		code, out, _ := runBench(t, nil, args...)
		for _, want := range []string{"bench relay [--db URL]", "bench cdc [--db URL]", "-workers-curve", "-cdc-window", "Examples:"} {
			if code != 0 || !strings.Contains(out, want) {
				t.Errorf("bench %q = %d, want 0 and %q in\n%s", args, code, want, out)
			}
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"frob"}, `unknown benchmark "frob"`},
		{[]string{"relay", "--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"relay", "extra"}, "unexpected arguments"},
		{[]string{"relay", "--rows", "0", "--db", "postgres://x"}, "must be positive"},
		{[]string{"relay", "--workers-curve", "1,x", "--db", "postgres://x"}, "--workers-curve"},
		{[]string{"relay", "--triggers", "sometimes", "--db", "postgres://x"}, "--triggers"},
	} {
		code, _, errOut := runBench(t, nil, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("bench %q = %d %q, want 2 and %q", tc.args, code, errOut, tc.want)
		}
	}
}
