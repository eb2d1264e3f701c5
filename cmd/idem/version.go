package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/idem-go/idem/internal/version"
)

// versionCommand is "idem version".
func versionCommand() *command {
	return &command{
		name:    "version",
		summary: "print idem's version, the Go version that built it and the platform",
		usage: `Usage:
  idem version

Prints one line: "idem v0.1.0 go1.26.8 linux/amd64". The version is the one
the images were built with (scripts/image.sh stamps "git describe"), the
module's version for "go install github.com/idem-go/idem/cmd/idem@VERSION",
or "(devel)" for a build that records none.`,
		setup: func(*flag.FlagSet) runFunc {
			return func(_ context.Context, e *env, args []string) error {
				if len(args) != 0 {
					return usagef("unexpected arguments %q", args)
				}
				_, err := fmt.Fprintln(e.stdout, version.Line("idem"))
				return err
			}
		},
	}
}
