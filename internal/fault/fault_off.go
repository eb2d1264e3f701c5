//go:build !idemfault

package fault

// Enabled says whether fault points are compiled in (build tag idemfault).
const Enabled = false

// Point marks the named fault point. This build has no fault points (no
// idemfault build tag): Point does nothing, and calls to it compile to
// nothing.
func Point(name string) {}
