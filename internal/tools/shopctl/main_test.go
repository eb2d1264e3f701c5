package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/idem-go/idem/internal/fault"
)

// shopBinary is the shop command, built once for the package's tests, with
// fault points: the crash table kills its processes at them. binDir holds
// it, and the other binaries the tests build.
var shopBinary, binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "shopctl-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir, shopBinary = dir, filepath.Join(dir, "shop")
	build := exec.Command("go", "build", "-race", "-tags", fault.Tag, "-o", shopBinary, shopPackage)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build shop:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// TestHelp checks "shopctl help" and its topics: each prints on stdout what
// --help prints; an unknown command or topic is a usage error.
func TestHelp(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{nil, []string{"chaos", "load", `"shopctl help <command>"`}},
		{[]string{"help"}, []string{"chaos", "load"}},
		{[]string{"help", "load"}, []string{"Usage: shopctl load [flags]", "--retry-rate", "SHOP_URL"}},
		{[]string{"help", "chaos"}, []string{"Usage: shopctl chaos [flags]", "-tags idemfault", "--only", "--shop", "SHOP_DB_URL"}},
	} {
		var out bytes.Buffer
		if err := run(tc.args, &out, &out); err != nil {
			t.Errorf("shopctl %q: %v", tc.args, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("shopctl %q does not print %q:\n%s", tc.args, w, out.String())
			}
		}
	}
	for _, args := range [][]string{{"help", "frob"}, {"help", "load", "chaos"}, {"frob"}} {
		var ue usageError
		if err := run(args, &bytes.Buffer{}, &bytes.Buffer{}); !errors.As(err, &ue) || !strings.Contains(err.Error(), `"shopctl help"`) {
			t.Errorf("shopctl %q: %v, want a usage error pointing to shopctl help", args, err)
		}
	}
	if err := run([]string{"load", "--help"}, &bytes.Buffer{}, &bytes.Buffer{}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("shopctl load --help: %v, want flag.ErrHelp", err)
	}
}

// TestChaosRefusesPlainShop: a shop built without the fault points cannot
// die at them, and shopctl chaos says how to build one that can.
func TestChaosRefusesPlainShop(t *testing.T) {
	t.Parallel()
	plain := filepath.Join(t.TempDir(), "shop")
	if out, err := exec.Command("go", "build", "-o", plain, shopPackage).CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for bin, want := range map[string]string{
		plain:               "built without fault points",
		shopBinary:          "", // accepted
		"/nonexistent/shop": "give a shop binary built by go build -tags " + fault.Tag,
	} {
		err := checkFaultBuild(bin)
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("checkFaultBuild(%s) = %v, want %q", bin, err, want)
		}
	}
	err := run([]string{"chaos", "--shop", plain, "--only", "carrier"}, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "-tags "+fault.Tag) {
		t.Errorf("shopctl chaos --shop <plain build>: %v, want a refusal naming the tag", err)
	}
}
