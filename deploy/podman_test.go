// Package deploy_test checks what deploy/ holds against the code: the
// images scripts/image.sh builds from deploy/*.Containerfile, run with
// podman against the test servers (TestRelayImage, TestShopImage), and the
// alert rules of deploy/prometheus, whose every metric must be one the
// collectors register (TestAlertMetrics). The Kubernetes manifests are
// checked by the module deploy/validate, which needs k8s.io/api.
//
// The image tests need podman and runc, which make test installs and
// gives a configuration and a store of their own in the test directory
// (scripts/lib/podman.sh; IDEM_TEST_SERVERS names them podman):
//
//	IDEM_TEST_SERVERS="postgres rabbitmq podman" make test ARGS=./deploy/
package deploy_test

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/internal/tools/shopkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// podmanEnv names the variable holding podman's path (scripts/lib/podman.sh).
const podmanEnv = "IDEM_TEST_PODMAN"

// podman is the container engine of the tests, with make test's
// configuration (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF in the
// environment): runc, a store in the test directory, no image ever pulled.
type podman struct {
	bin string
}

// newPodman returns the engine, or fails the test when make test did not
// install it.
func newPodman(t *testing.T) *podman {
	t.Helper()
	bin := os.Getenv(podmanEnv)
	if bin == "" {
		t.Fatalf("%s is not set: run the tests with `IDEM_TEST_SERVERS=\"postgres rabbitmq podman\" make test ARGS=./deploy/`, which installs and configures podman", podmanEnv)
	}
	return &podman{bin: bin}
}

// command is podman with args.
func (p *podman) command(args ...string) *exec.Cmd {
	return exec.Command(p.bin, args...)
}

// output runs podman with args and returns its standard output, failing
// the test on an error.
func (p *podman) output(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := p.command(args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

// image is an image scripts/image.sh built.
type image struct {
	// ref is its name and tag.
	ref string
	// version is the version stamped into its binary: the tag.
	version string
	// binary is the static binary it holds, as built.
	binary string
	// files are the headers of its files, by path without the leading
	// slash ("usr/local/bin/idem").
	files map[string]*tar.Header
	// config is its configuration (podman image inspect).
	config struct {
		User       string
		Env        []string
		Cmd        []string
		Entrypoint []string
		Labels     map[string]string
	}
}

// env returns the value of the image's variable name.
func (im *image) env(t *testing.T, name string) string {
	t.Helper()
	for _, kv := range im.config.Env {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			return v
		}
	}
	t.Fatalf("image %s sets no %s: %q", im.ref, name, im.config.Env)
	return ""
}

// buildMu makes the tests build their images one at a time: the second
// build's go build then finds the packages the two binaries share compiled
// by the first (CGO_ENABLED=0, none of the tests' own builds), rather than
// compiling them again at the same time.
var buildMu sync.Mutex

// build runs scripts/image.sh for the image of command name (idem, shop)
// under a name of the test's own, removed when the test ends, and checks
// what every image must be: a static binary, a user that is not root, the
// version stamped into the binary and the label.
func (p *podman) build(t *testing.T, name string) *image {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("bash", "../scripts/image.sh", name)
	cmd.Env = append(os.Environ(), "PODMAN="+p.bin, "IMAGE_REPO=localhost/idem-test-"+shopkit.RandomSuffix()+"/",
		"IMAGE_BUILD_DIR="+dir, "IMAGE_BUILD_FLAGS=--pull=never")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	buildMu.Lock()
	start := time.Now()
	err := cmd.Run()
	buildMu.Unlock()
	if err != nil {
		t.Fatalf("scripts/image.sh %s: %v\n%s", name, err, stderr.String())
	}
	im := &image{ref: strings.TrimSpace(stdout.String()), binary: filepath.Join(dir, name, name)}
	t.Logf("scripts/image.sh %s: %s in %v", name, im.ref, time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if out, err := p.command("rmi", "-f", im.ref).CombinedOutput(); err != nil {
			t.Errorf("podman rmi %s: %v\n%s", im.ref, err, out)
		}
	})
	_, im.version, _ = strings.Cut(im.ref, ":")
	if !strings.HasPrefix(im.ref, "localhost/") || im.version == "" {
		t.Fatalf("scripts/image.sh printed %q, want the image's name and tag", stdout.String())
	}
	var configs []struct{ Config json.RawMessage }
	if err := json.Unmarshal([]byte(p.output(t, "image", "inspect", im.ref)), &configs); err != nil || len(configs) != 1 {
		t.Fatalf("podman image inspect %s: %v (%d images)", im.ref, err, len(configs))
	}
	if err := json.Unmarshal(configs[0].Config, &im.config); err != nil {
		t.Fatal(err)
	}
	if im.config.User != "65532:65532" {
		t.Errorf("image %s runs as %q, want 65532:65532 (numeric, not root)", im.ref, im.config.User)
	}
	if got := im.config.Labels["org.opencontainers.image.version"]; got != im.version {
		t.Errorf("image %s: label org.opencontainers.image.version %q, want %q", im.ref, got, im.version)
	}
	checkStatic(t, im.binary)
	im.files = p.files(t, im.ref)
	for path, want := range map[string]struct {
		mode fs.FileMode
		uid  int
	}{
		"tmp":                               {fs.ModeDir | fs.ModeSticky | 0o777, 0},
		"etc/ssl/certs/ca-certificates.crt": {0o644, 0},
		strings.TrimPrefix(im.config.Entrypoint[0], "/"): {0o755, 0},
	} {
		h := im.files[path]
		if h == nil {
			t.Errorf("image %s has no /%s", im.ref, path)
			continue
		}
		if mode := h.FileInfo().Mode(); mode != want.mode || h.Uid != want.uid {
			t.Errorf("image %s: /%s is %v owned by %d, want %v owned by %d", im.ref, path, mode, h.Uid, want.mode, want.uid)
		}
	}
	return im
}

// files returns the headers of the files of image ref, by path without
// the leading slash, read from the export of a container of it.
func (p *podman) files(t *testing.T, ref string) map[string]*tar.Header {
	t.Helper()
	id := strings.TrimSpace(p.output(t, "create", ref))
	defer func() { _ = p.command("rm", "-f", id).Run() }()
	cmd := p.command("export", id)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	files := map[string]*tar.Header{}
	tr := tar.NewReader(out)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("podman export %s: %v", ref, err)
		}
		files[strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")] = h
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("podman export %s: %v", ref, err)
	}
	return files
}

// checkStatic fails the test unless the ELF file at path is a static
// executable: no program interpreter, no shared library.
func checkStatic(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			t.Errorf("%s has a program interpreter: not a static binary (CGO_ENABLED=0?)", path)
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	if len(libs) > 0 {
		t.Errorf("%s needs shared libraries %q: not a static binary", path, libs)
	}
}

// container is a container the test runs, attached: its output is podman
// run's, its exit status podman run's.
type container struct {
	name string
	cmd  *exec.Cmd
	out  *shopkit.LockedBuffer
	done chan struct{}
}

// start runs a container of the test's own with podman run's args (its
// options, the image, then the command), removed when the test ends.
func (p *podman) start(t *testing.T, args ...string) *container {
	t.Helper()
	c := &container{name: "idem-test-" + shopkit.RandomSuffix(), out: &shopkit.LockedBuffer{}, done: make(chan struct{})}
	c.cmd = p.command(append([]string{"run", "--rm", "--name", c.name}, args...)...)
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = p.command("rm", "-f", "-t", "0", c.name).Run()
		select {
		case <-c.done:
		case <-time.After(time.Minute):
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	})
	return c
}

// exited reports whether the container has exited.
func (c *container) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// wait waits until the container exits and returns its exit status.
func (c *container) wait(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(within):
		t.Fatalf("container %s still runs after %v:\n%s", c.name, within, tail(c.out.String()))
	}
	return c.cmd.ProcessState.ExitCode()
}

// waitOutput waits until the container's output holds want; it fails the
// test if the container exits first.
func (c *container) waitOutput(t *testing.T, want string, within time.Duration) {
	t.Helper()
	testsvc.WaitFor(t, within, "container "+c.name+" saying "+want, func() bool {
		if c.exited() {
			t.Fatalf("container %s exited (status %d) before saying %q:\n%s", c.name, c.cmd.ProcessState.ExitCode(), want, tail(c.out.String()))
		}
		return strings.Contains(c.out.String(), want)
	})
}

// stop stops the container as Kubernetes does (SIGTERM, then SIGKILL after
// the grace period) and returns its exit status.
func (p *podman) stop(t *testing.T, c *container) int {
	t.Helper()
	if out, err := p.command("stop", "-t", "30", c.name).CombinedOutput(); err != nil && !c.exited() {
		t.Fatalf("podman stop %s: %v\n%s", c.name, err, out)
	}
	return c.wait(t, time.Minute)
}

// secretDir writes files (name: content) into a new directory that the
// image's user (65532) can read once mounted, as Kubernetes mounts a
// Secret's keys (mode 0644 by default).
func secretDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// flagValue returns the value following flag in args.
func flagValue(t *testing.T, args []string, flag string) string {
	t.Helper()
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
	}
	t.Fatalf("no %s in %q", flag, args)
	return ""
}

func tail(s string) string {
	if len(s) > 4000 {
		return "..." + s[len(s)-4000:]
	}
	return s
}
