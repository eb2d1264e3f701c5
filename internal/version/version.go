// Package version says which version of idem a binary is, for "idem
// version", "shop version" and the images' labels.
//
// The version is, in order:
//
//   - the one stamped at link time, as scripts/image.sh does:
//     go build -ldflags "-X github.com/idem-go/idem/internal/version.stamped=v0.1.0";
//   - the module's version the Go command recorded: "v0.1.0" after go
//     install github.com/idem-go/idem/cmd/idem@v0.1.0, a pseudo-version for
//     a build in a clone of the repository (unless -buildvcs=false);
//   - "(devel)".
package version

import (
	"runtime"
	"runtime/debug"
)

// stamped is set with -ldflags -X (scripts/image.sh: git describe).
var stamped string

// Devel is the version of a binary that records none.
const Devel = "(devel)"

// String returns the binary's version: see the package's documentation.
func String() string {
	if stamped != "" {
		return stamped
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return Devel
}

// Line returns the line "idem version" and "shop version" print: the
// program's name, its version, the Go version that built it, and its
// platform ("idem v0.1.0 go1.26.8 linux/amd64").
func Line(program string) string {
	return program + " " + String() + " " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH
}
