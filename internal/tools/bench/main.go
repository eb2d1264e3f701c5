// Command bench measures the polling relay, the CDC relay and the binlog
// relay on a real database and broker. It is a tool of this repository, run from a clone,
// not part of the idem command that users install:
//
//	go run ./internal/tools/bench relay --db postgres://localhost/bench --runs 3
//	go run ./internal/tools/bench cdc --db postgres://localhost/bench --broker amqp://guest:guest@localhost:5672/
//	go run ./internal/tools/bench binlog --db mysql://user:pass@localhost:3306/bench --broker amqp://guest:guest@localhost:5672/
//	go run ./internal/tools/bench help
//
// docs/PERFORMANCE.md records what it measured, and how.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// env is what the benchmark needs from the process.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
}

// usageError is an error in the command line: the usage follows it.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, &env{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}, os.Args[1:]))
}

// run runs "bench relay|cdc|binlog|drain [flags]" and returns the exit status: 0, 1 on a
// failure, 2 on a command line error.
func run(ctx context.Context, e *env, args []string) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		printUsage(e.stdout)
		return 0
	}
	mode := args[0]
	if mode != "relay" && mode != "cdc" && mode != "binlog" && mode != "drain" {
		fmt.Fprintf(e.stderr, "bench: unknown benchmark %q: want relay, cdc, binlog or drain\nRun \"go run ./internal/tools/bench help\" for usage.\n", mode)
		return 2
	}
	fs := newFlagSet(e.stderr)
	o := registerFlags(fs)
	err := fs.Parse(args[1:])
	fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	switch {
	case errors.Is(err, flag.ErrHelp):
		printUsage(e.stdout)
		return 0
	case err != nil:
		err = &usageError{err.Error()}
	case fs.NArg() > 0:
		err = usagef("unexpected arguments %q", fs.Args())
	case mode == "cdc":
		err = runBenchCDC(ctx, e, o)
	case mode == "binlog":
		err = runBenchBinlog(ctx, e, o)
	case mode == "drain":
		err = runBenchDrain(ctx, e, o)
	default:
		err = runBenchRelay(ctx, e, o)
	}
	var ue *usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(e.stderr, "bench %s: %v\nRun \"go run ./internal/tools/bench help\" for usage.\n", mode, err)
		return 2
	default:
		fmt.Fprintf(e.stderr, "bench %s: %v\n", mode, err)
		return 1
	}
}

// newFlagSet returns a flag set that reports errors instead of exiting.
func newFlagSet(out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {} // run prints the usage
	return fs
}

func printUsage(w io.Writer) {
	fmt.Fprintf(w, "bench: measure the relay on a database (bench relay), the CDC relay against RabbitMQ (bench cdc), the binlog relay on MariaDB against RabbitMQ (bench binlog), the polling relay's drain on every dialect over few and many aggregates (bench drain)\n\n%s\n", strings.TrimSpace(relayUsage+cdcUsage+binlogUsage+drainUsage+examples))
	fs := newFlagSet(w)
	registerFlags(fs)
	fmt.Fprintln(w, "\nFlags:")
	fs.PrintDefaults()
}

const examples = `
Examples:
  go run ./internal/tools/bench relay --db postgres://localhost/bench --runs 3
  go run ./internal/tools/bench cdc --db postgres://localhost/bench --broker amqp://guest:guest@localhost:5672/
  go run ./internal/tools/bench binlog --db mysql://idem:idem@127.0.0.1:13306/idem_test --broker amqp://guest:guest@localhost:5672/ \
      --db-nobinlog mysql://idem:idem@127.0.0.1:13307/idem_test --runs 3
  go run ./internal/tools/bench drain --drain-db "$IDEM_TEST_POSTGRES_URL" --drain-db "$IDEM_TEST_MARIADB_URL" \
      --drain-db sqlite:/tmp/bench --rows 50000 --runs 3`
