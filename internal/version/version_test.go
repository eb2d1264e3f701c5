package version

import (
	"runtime"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestString: a stamped version wins; without one, a test binary records
// no module version (go test builds it as "(devel)"), and the line names
// the program, the version, Go's and the platform.
func TestString(t *testing.T) {
	if got := String(); got != Devel {
		t.Errorf("String() = %q in a test binary, want %q", got, Devel)
	}
	old := stamped
	t.Cleanup(func() { stamped = old })
	stamped = "v1.2.3"
	if got := String(); got != "v1.2.3" {
		t.Errorf("String() = %q with a stamped version, want v1.2.3", got)
	}
	line := Line("idem")
	if want := "idem v1.2.3 " + runtime.Version() + " "; !strings.HasPrefix(line, want) || !strings.HasSuffix(line, runtime.GOOS+"/"+runtime.GOARCH) {
		t.Errorf("Line(idem) = %q, want %q... %s/%s", line, want, runtime.GOOS, runtime.GOARCH)
	}
}
