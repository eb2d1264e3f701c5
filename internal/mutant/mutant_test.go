package mutant_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/mutant"
)

// TestChosenByEnv checks that IDEM_MUTANT chooses one mutant, with its
// argument, in a build with mutants, and nothing in a build without.
func TestChosenByEnv(t *testing.T) {
	if os.Getenv("IDEM_MUTANT_TEST_CHILD") != "" {
		// The child: print what the package says.
		for _, n := range mutant.Names {
			if mutant.On(n) {
				os.Stdout.WriteString(n + "=" + mutant.Arg(n) + "\n")
			}
		}
		return
	}
	t.Parallel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestChosenByEnv$")
	cmd.Env = append(os.Environ(), "IDEM_MUTANT_TEST_CHILD=1", mutant.EnvVar+"="+mutant.InboxSkipDedup+"=order")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	got, _, _ := strings.Cut(string(out), "PASS")
	want := ""
	if mutant.Enabled {
		want = mutant.InboxSkipDedup + "=order\n"
	}
	if got != want {
		t.Errorf("with %s=%s=order, the child chose %q, want %q (mutants compiled in: %v)", mutant.EnvVar, mutant.InboxSkipDedup, got, want, mutant.Enabled)
	}
}
