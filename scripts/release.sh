#!/usr/bin/env bash
# Tag a release: checks that the repository is ready, then creates the
# annotated tag VERSION on HEAD, whose message is the version's section of
# CHANGELOG.md. It pushes nothing (CONTRIBUTING.md, "Releasing", says what
# comes next).
#
# Usage:
#   bash scripts/release.sh v0.1.0
#
# Checks, in order; the first that fails stops the script, which says what
# to do:
#   - VERSION is vMAJOR.MINOR.PATCH;
#   - the work tree is clean: no change, staged or not, no untracked file;
#   - the tag does not exist yet;
#   - CHANGELOG.md has the version's section, "## [MAJOR.MINOR.PATCH] -
#     YYYY-MM-DD", not empty, below an "## [Unreleased]" section, and the
#     links of both at the bottom ("[Unreleased]: ...", "[X.Y.Z]: ...");
#   - every image of deploy/kubernetes has the version's tag;
#   - make lint passes.
#
# Environment:
#   RELEASE_SKIP_LINT=1  skip make lint (the script's own test, on a
#                        repository that has no lint)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export PATH="/usr/local/go/bin${HOME:+:$HOME/go/bin}:$PATH"

log() { echo "release: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ $# -eq 1 ] || die "usage: bash scripts/release.sh vMAJOR.MINOR.PATCH"
VERSION=$1
[[ $VERSION =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$ ]] ||
	die "version '$VERSION' is not vMAJOR.MINOR.PATCH (v0.1.0)"
NUMBER=${VERSION#v}

if [ -n "$(git status --porcelain)" ]; then
	git status --short >&2
	die "the work tree is not clean: commit or remove the changes above first"
fi
if git rev-parse -q --verify "refs/tags/$VERSION" >/dev/null; then
	die "tag $VERSION exists already (at $(git rev-list -n 1 "$VERSION")): choose the next version"
fi

# The version's section: from its heading to the next "## " heading.
CHANGELOG=CHANGELOG.md
[ -f "$CHANGELOG" ] || die "no $CHANGELOG"
heading=$(grep -nE "^## \[${NUMBER//./\\.}\]" "$CHANGELOG" | head -n 1 || true)
[ -n "$heading" ] ||
	die "$CHANGELOG has no section for $NUMBER: rename its \"## [Unreleased]\" to \"## [$NUMBER] - $(date -u +%F)\" and put a new, empty \"## [Unreleased]\" above it"
line=${heading%%:*}
heading=${heading#*:}
[[ $heading =~ ^"## ["${NUMBER}"] - "[0-9]{4}-[0-9]{2}-[0-9]{2}$ ]] ||
	die "$CHANGELOG, line $line: \"$heading\": want \"## [$NUMBER] - YYYY-MM-DD\""
DATE=${heading##* - }
unreleased=$(grep -nE '^## \[Unreleased\]' "$CHANGELOG" | head -n 1 | cut -d: -f1 || true)
[ -n "$unreleased" ] && [ "$unreleased" -lt "$line" ] ||
	die "$CHANGELOG: no \"## [Unreleased]\" section above \"$heading\": add an empty one, for what comes after $VERSION"
section=$(awk -v start="$line" 'NR > start && /^## / { exit } NR > start' "$CHANGELOG" |
	awk '/^\[[^]]+\]: / { exit } { print }' | sed -e :a -e '/^\n*$/{$d;N;ba' -e '}')
[ -n "$(echo "$section" | tr -d '[:space:]')" ] || die "$CHANGELOG: the section of $NUMBER is empty"
for link in Unreleased "$NUMBER"; do
	grep -qE "^\[${link//./\\.}\]: [^ ]+$" "$CHANGELOG" ||
		die "$CHANGELOG: no link \"[$link]: URL\" at the bottom (Keep a Changelog: [Unreleased] compares $VERSION...HEAD, [$NUMBER] the tag's page or the comparison with the previous version)"
done

# The manifests deploy the version being tagged.
bad=$(grep -hE '^\s*(- )?image:' deploy/kubernetes/*.yaml 2>/dev/null | grep -vE ":${VERSION//./\\.}\s*$" || true)
[ -z "$bad" ] || die "deploy/kubernetes has images without the tag $VERSION:
$bad
set them to $VERSION (the tag scripts/image.sh gives the images built from the tag)"

if [ "${RELEASE_SKIP_LINT:-}" != 1 ]; then
	log "make lint ..."
	make lint
fi

msg=$(mktemp)
trap 'rm -f "$msg"' EXIT
printf 'idem %s (%s)\n\n%s\n' "$VERSION" "$DATE" "$section" >"$msg"
# --cleanup=whitespace: keep the section's "### Added" headings, which the
# default cleanup would take for comments.
git tag -a "$VERSION" --cleanup=whitespace -F "$msg"
log "tagged $VERSION at $(git rev-parse --short HEAD): push it with \`git push origin $VERSION\`, then build and push the images (make image; CONTRIBUTING.md, \"Releasing\")"
