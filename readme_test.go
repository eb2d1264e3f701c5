package idem_test

import (
	"os"
	"strings"
	"testing"
)

// The README's first program is Example, quoted: the README's copy must say
// what the tested one does.
func TestREADMEQuotesExample(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	body := func(src, start, end string) string {
		t.Helper()
		i := strings.Index(src, start)
		if i < 0 {
			t.Fatalf("%q not found", start)
		}
		j := strings.Index(src[i:], end)
		if j < 0 {
			t.Fatalf("%q not found after %q", end, start)
		}
		return src[i+len(start) : i+j]
	}
	quoted := body(string(readme), "func main() {\n", "\n}\n```")
	tested := body(string(example), "func Example() {\n", "\n}\n")
	tested = strings.Replace(tested, "// Output: applied", "// applied", 1)
	if quoted != tested {
		t.Errorf("README.md's program differs from Example in example_test.go; copy Example's body into the README's func main.\nREADME:\n%s\nExample:\n%s", quoted, tested)
	}
}
