// Package envflag reads the flags a command line leaves out from
// environment variables, and prints a command's usage with the variable of
// each flag: what the shop and its tools share.
//
//	env := map[string]string{"db": "SHOP_DB_URL"}
//	fs.Usage = envflag.Usage(fs, env, "Usage: shop [flags]\n\nFlags:\n", "")
//	err := envflag.Parse(fs, os.Args[1:], env)
package envflag

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

// Parse parses args into fs, then sets each flag that args leave out, and
// whose name env maps to an environment variable that is set, from that
// variable.
func Parse(fs *flag.FlagSet, args []string, env map[string]string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		name := env[f.Name]
		if name == "" || set[f.Name] || err != nil {
			return
		}
		if v, ok := os.LookupEnv(name); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", name, v, e)
			}
		}
	})
	return err
}

// Usage returns a usage function for fs that prints head, every flag with
// its default and its environment variable from env, then tail, on fs's
// output.
func Usage(fs *flag.FlagSet, env map[string]string, head, tail string) func() {
	return func() {
		w := fs.Output()
		fmt.Fprint(w, head)
		fs.VisitAll(func(f *flag.Flag) {
			def := ""
			if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "0s" {
				def = " (default " + f.DefValue + ")"
			}
			usage := strings.ReplaceAll(f.Usage, "\n", "\n        ")
			fmt.Fprintf(w, "  --%s\n        %s%s", f.Name, usage, def)
			if e := env[f.Name]; e != "" {
				fmt.Fprintf(w, " [$%s]", e)
			}
			fmt.Fprintln(w)
		})
		fmt.Fprint(w, tail)
	}
}
