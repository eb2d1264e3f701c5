package textshow_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/idem-go/idem/internal/textshow"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Text is shown as it is; control characters and invalid UTF-8 quoted.
func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"order placed":    "order placed",
		"two\nlines\ttab": "two\nlines\ttab",
		"nul\x00":         `"nul\x00"`,
		"bad \xff":        `"bad \xff"`,
		"del\x7f":         `"del\x7f"`,
		"":                "",
		"été ✓":           "été ✓",
	} {
		if got := textshow.Printable([]byte(in)); got != want {
			t.Errorf("Printable(%q) = %q, want %q", in, got, want)
		}
	}
}

// White space folds to single spaces; a longer text is cut at n runes.
func TestOneLine(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"a\n  b\tc", 10, "a b c"},
		{"abcdef", 6, "abcdef"},
		{"abcdefg", 6, "abcde…"},
		{"ééééééé", 4, "ééé…"},
	} {
		if got := textshow.OneLine(c.in, c.n); got != c.want {
			t.Errorf("OneLine(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}
