// Command idem operates idem's tables and relay: apply migrations, run the
// relay, replay a period, inspect and retry failed messages, and purge
// processed_event.
//
//	idem migrate up --db postgres://localhost/app
//	idem help migrate
//
// Every --db flag can also come from IDEM_DB_URL or a file (--db-file),
// every --broker flag from IDEM_BROKER_URL or a file (--broker-file), so
// that passwords stay off the command line. What idem prints (logs,
// errors, status, panics) shows URLs without their passwords.
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

	"github.com/idem-go/idem/internal/envflag"
	"github.com/idem-go/idem/internal/redact"
)

// command is one "idem <name>" subcommand.
type command struct {
	name    string
	summary string
	// usage is the text after the synopsis in "idem help <name>": what it
	// does, then examples.
	usage string
	// setup declares the command's flags on fs and returns the function that
	// runs the command with the positional arguments once flags are parsed.
	setup func(fs *flag.FlagSet) runFunc
}

type runFunc func(ctx context.Context, env *env, args []string) error

// commands are the subcommands of idem, in the order "idem help" lists
// them; each file of this package holds one with its flags and the function
// that runs it.
var commands = []*command{
	cdcCommand(),
	dashboardCommand(),
	failedCommand(),
	migrateCommand(),
	pauseCommand(),
	purgeCommand(),
	relayCommand(),
	replayCommand(),
	resumeCommand(),
	statusCommand(),
	versionCommand(),
}

// lookup returns the command named name, or nil.
func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// env is what a command needs from the process.
type env struct {
	stdout, stderr io.Writer
	stdin          io.Reader
	getenv         func(string) string
}

// usageError is an error in the command line: the command's usage follows it.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

func main() {
	defer redact.ExitOnPanic("idem")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	e := &env{stdout: os.Stdout, stderr: os.Stderr, stdin: os.Stdin, getenv: os.Getenv}
	os.Exit(run(ctx, e, os.Args[1:]))
}

func run(ctx context.Context, e *env, args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		printOverview(e.stdout)
		return 0
	}
	if args[0] == "help" {
		if len(args) == 1 {
			printOverview(e.stdout)
			return 0
		}
		c := lookup(args[1])
		if c == nil {
			fmt.Fprintf(e.stderr, "idem: unknown command %q; run \"idem help\" for the list\n", args[1])
			return 2
		}
		printUsage(e.stdout, c)
		return 0
	}
	c := lookup(args[0])
	if c == nil {
		fmt.Fprintf(e.stderr, "idem: unknown command %q; run \"idem help\" for the list\n", args[0])
		return 2
	}
	fs := flagSet(c.name, e.stderr)
	runner := c.setup(fs)
	pos, err := parseInterleaved(fs, args[1:])
	if err == nil {
		if ferr := envflag.ReadFiles(fs); ferr != nil {
			err = &usageError{ferr.Error()}
		}
	}
	if err == nil {
		err = runner(ctx, e, pos)
	}
	var ue *usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		printUsage(e.stdout, c)
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(e.stderr, "idem %s: %s\nRun \"idem help %s\" for usage.\n", c.name, redact.String(err.Error()), c.name)
		return 2
	default:
		fmt.Fprintf(e.stderr, "idem %s: %s\n", c.name, redact.String(err.Error()))
		return 1
	}
}

func printOverview(w io.Writer) {
	fmt.Fprint(w, `idem moves events reliably between services: a transactional outbox, a relay
to the broker, and idempotent consumers.

Usage:
  idem <command> [flags]

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
Run "idem help <command>" for a command's flags and examples.
The database URL comes from --db, --db-file FILE or IDEM_DB_URL, the broker
URL from --broker, --broker-file FILE or IDEM_BROKER_URL: keep a URL with a
password in the variable or the file, off the command line (ps shows it).
`)
}

func printUsage(w io.Writer, c *command) {
	fmt.Fprintf(w, "idem %s: %s\n\n%s\n", c.name, c.summary, strings.TrimSpace(c.usage))
	fs := flagSet(c.name, w)
	c.setup(fs)
	fmt.Fprintln(w, "\nFlags:")
	fs.PrintDefaults()
}

// parseInterleaved parses flags wherever they are among the positional
// arguments ("idem migrate up --db URL") and returns the positional ones.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, &usageError{err.Error()}
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if rest[0] == "--" {
			return append(pos, rest[1:]...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// flagSet returns a flag set that reports errors instead of exiting.
func flagSet(name string, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("idem "+name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {} // run prints the command's own usage
	return fs
}
