//go:build !idemmutant

package mutant

// Enabled says whether mutants are compiled in (build tag idemmutant).
const Enabled = false

// On reports whether IDEM_MUTANT chooses the mutant name. This build has
// no mutants (no idemmutant build tag): it is always false.
func On(name string) bool { return false }

// Arg returns the argument IDEM_MUTANT gives the mutant name. This build
// has no mutants: it is always "".
func Arg(name string) string { return "" }
