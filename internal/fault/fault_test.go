package fault_test

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/goleak"

	"github.com/idem-go/idem/internal/fault"
	"github.com/idem-go/idem/internal/mutant"
)

// childEnv makes the test binary a child process that hits a fault point.
const childEnv = "IDEM_FAULT_TEST_CHILD"

// childPoint is the point the child hits five times.
const childPoint = "test.point"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		for i := 1; i <= 5; i++ {
			fmt.Println("hit", i)
			fault.Point(childPoint)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// TestPoint runs a child process that hits a point armed to fire on its
// third hit. With fault points compiled in, the child dies there by SIGKILL;
// without, IDEM_FAULT changes nothing.
func TestPoint(t *testing.T) {
	t.Parallel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", fault.EnvVar+"=other.point, "+childPoint+"@3")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	if !fault.Enabled {
		if err != nil || stdout.String() != "hit 1\nhit 2\nhit 3\nhit 4\nhit 5\n" || stderr.Len() > 0 {
			t.Fatalf("without fault points the child must ignore %s: %v\nstdout:\n%s\nstderr:\n%s", fault.EnvVar, err, stdout.String(), stderr.String())
		}
		return
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("child: %v, want killed\nstdout:\n%s", err, stdout.String())
	}
	if ws := ee.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want SIGKILL", ws)
	}
	if got := stdout.String(); got != "hit 1\nhit 2\nhit 3\n" {
		t.Fatalf("child printed %q, want three hits (killed on the third)", got)
	}
	if !strings.Contains(stderr.String(), "idem: fault point "+childPoint+": killing process") {
		t.Fatalf("stderr %q does not name the point", stderr.String())
	}
}

// TestPointsDocumented checks that docs/ARCHITECTURE.md's "Fault points"
// section lists exactly the points of Points.
func TestPointsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Fault points\n")
	if !ok {
		t.Fatal(`docs/ARCHITECTURE.md has no "## Fault points" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	documented := map[string]bool{}
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "|"), "|")
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(first, -1) {
			documented[m[1]] = true
		}
	}
	seen := map[string]bool{}
	for _, p := range fault.Points {
		if seen[p] {
			t.Errorf("point %s listed twice in Points", p)
		}
		seen[p] = true
		if !documented[p] {
			t.Errorf("point %s is not in docs/ARCHITECTURE.md's Fault points table", p)
		}
	}
	for p := range documented {
		if !seen[p] {
			t.Errorf("docs/ARCHITECTURE.md lists %s, which is not in fault.Points", p)
		}
	}
}

// TestProductionBuild builds the commands without the build tag and checks
// that the mechanism is not in them: no fault.Point function (the linker
// keeps it only when something calls it), no kill message, and in cmd/idem
// neither the environment variable's name nor the relay's point names. No
// mutant (internal/mutant, build tag idemmutant) is in them either, nor in
// the shop built with idemfault, as shopctl chaos runs it: no symbol of
// the package, neither its variable's name nor a mutant's.
func TestProductionBuild(t *testing.T) {
	t.Parallel()
	mutants := append([]string{mutant.EnvVar}, mutant.Names...)
	for _, c := range []struct {
		pkg, tags string
		// noFault: no fault point; absent: strings not in the binary.
		noFault bool
		absent  []string
	}{
		{"cmd/idem", "", true, append([]string{fault.EnvVar, fault.RelayAfterClaim, fault.RelayAfterPublishBeforeMark, fault.RelayAfterMark}, mutants...)},
		// The crash table (shopctl chaos) refuses a shop built without the
		// tag.
		{"cmd/shop", "", true, mutants},
		{"cmd/shop", fault.Tag, false, mutants},
	} {
		bin := filepath.Join(t.TempDir(), filepath.Base(c.pkg))
		// With -race when this test has it: the packages that do not
		// import fault are then already compiled.
		args := []string{"build", "-o", bin}
		if raceEnabled {
			args = append(args, "-race")
		}
		if c.tags != "" {
			args = append(args, "-tags", c.tags)
		}
		// go test puts its own go first in PATH.
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
			if c.noFault && strings.HasPrefix(s.Name, "github.com/idem-go/idem/internal/fault.") ||
				strings.HasPrefix(s.Name, "github.com/idem-go/idem/internal/mutant.") {
				t.Errorf("%s built with tags %q has the symbol %s", c.pkg, c.tags, s.Name)
			}
		}
		b, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		absent := c.absent
		if c.noFault {
			absent = append(absent, "fault point %s")
		}
		for _, s := range absent {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("%s built with tags %q contains %q", c.pkg, c.tags, s)
			}
		}
	}
}

// BenchmarkPoint measures an unarmed point. Without the build tag the call
// compiles to nothing (go build -gcflags=-m ./relay/ reports "inlining call
// to fault.Point" and the benchmark below measures an empty loop); with it,
// an unarmed point costs an atomic load.
func BenchmarkPoint(b *testing.B) {
	for range b.N {
		fault.Point(fault.RelayAfterClaim)
	}
}
