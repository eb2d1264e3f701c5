package mutant_test

import (
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/fault"
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

// TestAbsentFromBuilds builds the commands without the tag idemmutant, the
// shop with idemfault as shopctl chaos runs it, and checks that no mutant
// is in them: no symbol of this package, and neither the environment
// variable's name nor a mutant's name.
func TestAbsentFromBuilds(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ pkg, tags string }{
		{"cmd/idem", ""},
		{"cmd/shop", fault.Tag},
	} {
		bin := filepath.Join(t.TempDir(), filepath.Base(c.pkg))
		args := []string{"build", "-o", bin}
		if c.tags != "" {
			args = append(args, "-tags", c.tags)
		}
		if raceEnabled {
			args = append(args, "-race")
		}
		out, err := exec.Command("go", append(args, "github.com/idem-go/idem/"+c.pkg)...).CombinedOutput()
		if err != nil {
			t.Fatalf("go build %s: %v\n%s", c.pkg, err, out)
		}
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		syms, err := f.Symbols()
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range syms {
			if strings.HasPrefix(s.Name, "github.com/idem-go/idem/internal/mutant.") {
				t.Errorf("%s built with tags %q has the symbol %s", c.pkg, c.tags, s.Name)
			}
		}
		b, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range append([]string{mutant.EnvVar}, mutant.Names...) {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("%s built with tags %q contains %q", c.pkg, c.tags, s)
			}
		}
	}
}
