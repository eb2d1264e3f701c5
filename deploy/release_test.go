package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// changelog is a CHANGELOG.md cut for v0.2.0, as CONTRIBUTING.md says.
const changelog = `# Changelog

Intro.

## [Unreleased]

## [0.2.0] - 2026-12-07

Two things.

### Added

- A thing.
- Another.

## [0.1.0] - 2026-11-01

### Added

- The first.

[Unreleased]: https://github.com/idem-go/idem/compare/v0.2.0...HEAD
[0.2.0]: https://github.com/idem-go/idem/compare/v0.1.0...v0.2.0
[0.1.0]: https://github.com/idem-go/idem/releases/tag/v0.1.0
`

// manifest is a deploy/kubernetes file with one image.
const manifest = "spec:\n  containers:\n    - image: registry.example.com/idem:v0.2.0\n"

// releaseRepo makes a git repository holding scripts/release.sh, the
// changelog and the manifest, committed, and returns its directory.
func releaseRepo(t *testing.T, changelog, manifest string) string {
	t.Helper()
	dir := t.TempDir()
	script, err := os.ReadFile("../scripts/release.sh")
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{
		"scripts/release.sh":         string(script),
		"CHANGELOG.md":               changelog,
		"deploy/kubernetes/app.yaml": manifest,
	} {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git(t, dir, "init", "-q")
	git(t, dir, "add", ".")
	git(t, dir, "commit", "-q", "-m", "release")
	return dir
}

// gitEnv gives git an identity of its own, whatever the machine's.
var gitEnv = []string{"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t",
	"GIT_COMMITTER_EMAIL=t@example.com", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1"}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), gitEnv...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// release runs the repository's scripts/release.sh, without make lint,
// and returns its exit status and output.
func release(t *testing.T, dir, version string) (int, string) {
	t.Helper()
	cmd := exec.Command("bash", "scripts/release.sh", version)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append(gitEnv, "RELEASE_SKIP_LINT=1")...)
	out, err := cmd.CombinedOutput()
	if err != nil && cmd.ProcessState == nil {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

// TestReleaseScript: scripts/release.sh tags HEAD with an annotated tag
// whose message is the version's CHANGELOG section, its "###" headings
// kept; and it tags nothing when the tree is not clean, the version is not
// semantic, the section, the empty Unreleased section above it or a link is
// missing, the tag exists, or a manifest deploys another version.
func TestReleaseScript(t *testing.T) {
	t.Parallel()
	dir := releaseRepo(t, changelog, manifest)
	if code, out := release(t, dir, "v0.2.0"); code != 0 {
		t.Fatalf("release v0.2.0: exit status %d\n%s", code, out)
	}
	if typ := strings.TrimSpace(git(t, dir, "cat-file", "-t", "v0.2.0")); typ != "tag" {
		t.Errorf("v0.2.0 is a %s, want an annotated tag", typ)
	}
	msg := git(t, dir, "tag", "-l", "--format=%(contents)", "v0.2.0")
	want := "idem v0.2.0 (2026-12-07)\n\nTwo things.\n\n### Added\n\n- A thing.\n- Another.\n"
	if strings.TrimSpace(msg) != strings.TrimSpace(want) {
		t.Errorf("the tag's message:\n%s\nwant:\n%s", msg, want)
	}
	if code, out := release(t, dir, "v0.2.0"); code == 0 || !strings.Contains(out, "exists already") {
		t.Errorf("release of an existing tag: exit status %d\n%s", code, out)
	}

	for _, tc := range []struct {
		name, version, changelog, manifest, dirty, want string
	}{
		{"not semantic", "0.2", changelog, manifest, "", "is not vMAJOR.MINOR.PATCH"},
		{"dirty tree", "v0.2.0", changelog, manifest, "new.txt", "not clean"},
		{"no section", "v0.3.0", changelog, strings.ReplaceAll(manifest, "v0.2.0", "v0.3.0"), "", "no section for 0.3.0"},
		{"no date", "v0.2.0", strings.Replace(changelog, "## [0.2.0] - 2026-12-07", "## [0.2.0]", 1), manifest, "", `want "## [0.2.0] - YYYY-MM-DD"`},
		{"no unreleased", "v0.2.0", strings.Replace(changelog, "## [Unreleased]\n", "", 1), manifest, "", `no "## [Unreleased]" section above`},
		{"no link", "v0.2.0", strings.Replace(changelog, "[0.2.0]: https", "[0.2]: https", 1), manifest, "", `no link "[0.2.0]: URL"`},
		{"empty section", "v0.2.0", strings.Replace(changelog, "Two things.\n\n### Added\n\n- A thing.\n- Another.\n", "", 1), manifest, "", "is empty"},
		{"other image", "v0.2.0", changelog, strings.ReplaceAll(manifest, "v0.2.0", "v0.1.0"), "", "images without the tag v0.2.0"},
	} {
		dir := releaseRepo(t, tc.changelog, tc.manifest)
		if tc.dirty != "" {
			if err := os.WriteFile(filepath.Join(dir, tc.dirty), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		code, out := release(t, dir, tc.version)
		if code == 0 || !strings.Contains(out, tc.want) {
			t.Errorf("%s: exit status %d, want a refusal saying %q:\n%s", tc.name, code, tc.want, out)
		}
		if tags := git(t, dir, "tag", "-l"); tags != "" {
			t.Errorf("%s: tagged %q", tc.name, tags)
		}
	}
}
