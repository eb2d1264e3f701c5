package main

import (
	"bytes"
	"errors"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/redact"
)

// TestHelpTopics checks "shop help" and "shop help broker": each prints on
// stdout what --help prints, and exits 0, as "shop version" prints its line;
// an unknown topic, or a tool's command (shopctl's chaos and load), is a
// usage error (exit 2).
func TestHelpTopics(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"help"}, []string{"Usage: shop [flags]", "shop help [broker]", "--services", "SHOP_DB_URL", "Examples:", "internal/tools/shopctl"}},
		{[]string{"help", "broker"}, []string{"Usage: shop broker [flags]", "--listen", "SHOP_DATA_DIR"}},
		{[]string{"version"}, []string{"shop ", " " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH}},
	} {
		cmd := exec.Command(shopBinary, tc.args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Errorf("shop %v: %v\n%s", tc.args, err, stderr.String())
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(stdout.String(), w) {
				t.Errorf("shop %v does not print %q on stdout:\n%s", tc.args, w, stdout.String())
			}
		}
	}
	for _, args := range [][]string{{"version", "frob"}, {"help", "frob"}, {"help", "load"}, {"help", "broker", "chaos"}, {"frob"}, {"chaos"}, {"load"}} {
		out, err := exec.Command(shopBinary, args...).CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), `"shop help"`) {
			t.Errorf("shop %v: %v, want exit status 2 and a pointer to shop help\n%s", args, err, out)
		}
	}
}

// TestOrderHowTo checks that the banner's command is ready to paste: a
// quoted key of its own, and nothing to install to make new ones.
func TestOrderHowTo(t *testing.T) {
	t.Parallel()
	got := orderHowTo("127.0.0.1:8080", "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b")
	for _, want := range []string{
		"curl -si -X POST http://127.0.0.1:8080/orders -H 'Content-Type: application/json' -H 'Idempotency-Key: 0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b'",
		"/proc/sys/kernel/random/uuid",
		"curl -s http://127.0.0.1:8080/orders/<id>",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("banner does not say %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "uuidgen") {
		t.Errorf("banner needs uuidgen, which a stock Debian does not have:\n%s", got)
	}
}

// TestHelpHasNoPassword: no example of the shop's help puts a password on
// the command line: they use variables and files.
func TestHelpHasNoPassword(t *testing.T) {
	t.Parallel()
	for _, line := range strings.Split(runHelpHead+runHelpTail, "\n") {
		if redact.String(line) != line || strings.Contains(line, "TOKEN=") {
			t.Errorf("shop help: a secret on a command line: %q", line)
		}
	}
}
