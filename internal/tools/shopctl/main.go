// Command shopctl drives the reference shop (cmd/shop) from outside, as the
// tests and the measurements of docs/PERFORMANCE.md do: it runs the crash
// table and the random kills against shop processes (shopctl chaos), and
// places orders through the order API to measure throughput, latency and the
// cost of an order (shopctl load). It is a tool of this repository, run from
// a clone, not part of the shop:
//
//	go run ./internal/tools/shopctl chaos
//	go run ./internal/tools/shopctl chaos --random 2m --db postgres://localhost/shop --broker amqp://localhost/
//	go run ./internal/tools/shopctl load --orders 10000 --concurrency 64 --retry-rate 0.05
//	go run ./internal/tools/shopctl help [chaos|load]
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// commands are shopctl's commands; each parses its flags (--help prints
// them and its usage) and runs.
var commands = []struct {
	name, summary string
	run           func(args []string, stdout, stderr io.Writer) error
}{
	{"chaos", "kill shop processes at named fault points, or at random under load, and check every database", chaosMain},
	{"load", "place orders through the order API and report throughput, latency and the cost of an order", loadMain},
}

func main() {
	err := run(os.Args[1:], os.Stdout, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "shopctl:", err)
		var ue usageError
		if errors.As(err, &ue) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// usageError is a command line that names no command or help topic.
type usageError string

func (e usageError) Error() string { return string(e) }

// run runs the command that args name; "help" and no command print the
// overview, "help NAME" what NAME --help prints.
func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" && len(args) == 1 {
		printOverview(stdout)
		return nil
	}
	if args[0] == "help" {
		if len(args) > 2 {
			return usageError(fmt.Sprintf("shopctl help takes one topic, got %q; run \"shopctl help\"", strings.Join(args[1:], " ")))
		}
		c := lookup(args[1])
		if c == nil {
			return usageError(fmt.Sprintf("no help for %q: run \"shopctl help\"", args[1]))
		}
		if err := c(([]string{"--help"}), stdout, stdout); !errors.Is(err, flag.ErrHelp) {
			return err
		}
		return nil
	}
	c := lookup(args[0])
	if c == nil {
		return usageError(fmt.Sprintf("unknown command %q; run \"shopctl help\"", args[0]))
	}
	return c(args[1:], stdout, stderr)
}

// lookup returns the function that runs the command named name, or nil.
func lookup(name string) func(args []string, stdout, stderr io.Writer) error {
	for _, c := range commands {
		if c.name == name {
			return c.run
		}
	}
	return nil
}

func printOverview(w io.Writer) {
	fmt.Fprint(w, `shopctl drives the reference shop (cmd/shop) from outside.

Usage:
  go run ./internal/tools/shopctl <command> [flags]

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-6s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
Run "shopctl help <command>" for a command's flags and examples.
`)
}
