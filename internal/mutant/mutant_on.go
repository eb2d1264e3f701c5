//go:build idemmutant

package mutant

import (
	"fmt"
	"os"
	"strings"
	"sync"
)

// Enabled says whether mutants are compiled in (build tag idemmutant).
const Enabled = true

var (
	once        sync.Once
	chosen, arg string
)

func load() {
	spec := strings.TrimSpace(os.Getenv(EnvVar))
	if spec == "" {
		return
	}
	chosen, arg, _ = strings.Cut(spec, "=")
	fmt.Fprintf(os.Stderr, "idem: mutant %s active (%s=%s): this build breaks a guarantee on purpose\n", chosen, EnvVar, spec)
}

// On reports whether IDEM_MUTANT chooses the mutant name.
func On(name string) bool {
	once.Do(load)
	return chosen == name
}

// Arg returns the argument IDEM_MUTANT gives the mutant name ("" when
// none, or when another mutant is chosen).
func Arg(name string) string {
	if !On(name) {
		return ""
	}
	return arg
}
