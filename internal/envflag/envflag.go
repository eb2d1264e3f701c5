// Package envflag reads the flags a command line leaves out from
// environment variables, and the flags that hold secrets from files, and
// prints a command's usage with the variable of each flag: what the shop,
// its tools and idem share.
//
//	env := map[string]string{"db": "SHOP_DB_URL"}
//	envflag.FileFlag(fs, "db") // --db-file FILE
//	fs.Usage = envflag.Usage(fs, env, "Usage: shop [flags]\n\nFlags:\n", "")
//	err := envflag.Parse(fs, os.Args[1:], env)
package envflag

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
)

// Parse parses args into fs, reads the files of its file flags
// (ReadFiles), then sets each flag that args leave out, and whose name env
// maps to an environment variable that is set, from that variable.
func Parse(fs *flag.FlagSet, args []string, env map[string]string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := ReadFiles(fs); err != nil {
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
			if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "0s" && f.DefValue != "false" {
				def = " (default " + f.DefValue + ")"
			}
			_, usage := flag.UnquoteUsage(f)
			usage = strings.ReplaceAll(usage, "\n", "\n        ")
			fmt.Fprintf(w, "  --%s\n        %s%s", f.Name, usage, def)
			if e := env[f.Name]; e != "" {
				fmt.Fprintf(w, " [$%s]", e)
			}
			fmt.Fprintln(w)
		})
		fmt.Fprint(w, tail)
	}
}

// FileSuffix ends the name of the flag FileFlag declares.
const FileSuffix = "-file"

// fileFlag is the value of a flag NAME-file: the files given, read by
// ReadFiles into the flag NAME.
type fileFlag struct {
	target string
	paths  []string
}

func (f *fileFlag) String() string {
	if f == nil {
		return ""
	}
	return strings.Join(f.paths, ",")
}

func (f *fileFlag) Set(path string) error {
	if path == "" {
		return errors.New("want a file name")
	}
	f.paths = append(f.paths, path)
	return nil
}

// FileFlag declares on fs the flag NAME-file for the flag name, which fs
// must already have: a file whose content, without its trailing newline, is
// the value of --name. A URL with a password then stays off the command
// line, where ps and /proc show it to every user of the machine. Repeated,
// it sets a repeatable flag once per file. ReadFiles (Parse calls it) reads
// the files.
func FileFlag(fs *flag.FlagSet, name string) {
	if fs.Lookup(name) == nil {
		panic("envflag: FileFlag(" + name + "): no flag " + name)
	}
	fs.Var(&fileFlag{target: name}, name+FileSuffix,
		"`FILE` holding the --"+name+" value (without its trailing newline), instead of --"+name+": keeps a password off the command line")
}

// ReadFiles sets each flag whose file flag (FileFlag) was given from its
// files. Giving a flag and its file flag both is an error naming them.
func ReadFiles(fs *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.Visit(func(f *flag.Flag) {
		ff, ok := f.Value.(*fileFlag)
		if !ok || err != nil {
			return
		}
		if given[ff.target] {
			err = fmt.Errorf("--%s and --%s both given: give one", ff.target, f.Name)
			return
		}
		for _, path := range ff.paths {
			v, rerr := ReadFile(path)
			if rerr != nil {
				err = fmt.Errorf("--%s: %w", f.Name, rerr)
				return
			}
			if serr := fs.Set(ff.target, v); serr != nil {
				// The value is a secret: the error names the file, not it.
				err = fmt.Errorf("--%s %s: the value it holds is refused by --%s", f.Name, path, ff.target)
				return
			}
		}
	})
	return err
}

// ReadFile returns the content of the file at path without its trailing
// newline ("\n" or "\r\n"): a secret kept in a file. An empty file is an
// error.
func ReadFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, nil
}
