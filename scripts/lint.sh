#!/usr/bin/env bash
# make lint: the checks every change must pass, in the order a failure is
# cheapest to read:
#   0. no tracked file is over 1 MB or an executable binary (ELF, Mach-O,
#      PE, WebAssembly): a Go module ships every tracked file to every
#      `go get`, so build output never belongs in the repository;
#   1. gofmt -l prints nothing (run `gofmt -w .` to fix);
#   2. go vet, with and without the idemfault build tag (internal/fault has
#      a file for each), then in each nested module, found by its go.mod
#      (deploy/validate: the checks of the Kubernetes manifests and alert
#      rules; internal/mysql8test: the MySQL 8 stand-in's tests);
#   3. staticcheck, with and without the tag, at STATICCHECK_VERSION,
#      installed with `go install` into .bin/ the first time (the Go module
#      proxy must be reachable then), then in each nested module. Its checks
#      are staticcheck's defaults; staticcheck.conf, if present, lists
#      exclusions and why.
# The exit status is 0 only when every check passes.
#
# Environment:
#   STATICCHECK_VERSION  honnef.co/go/tools version (default v0.8.2)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export PATH="/usr/local/go/bin${HOME:+:$HOME/go/bin}:$PATH"
STATICCHECK_VERSION=${STATICCHECK_VERSION:-v0.8.2}
STATICCHECK=$ROOT/.bin/staticcheck

log() { echo "lint: $*" >&2; }

log "tracked files: none over 1 MB, no executable binary"
bad=
while IFS= read -r -d '' f; do
	[ -f "$f" ] || continue # deleted in the work tree, not yet committed
	size=$(stat -c %s -- "$f")
	if [ "$size" -gt 1048576 ]; then
		bad+="  $f: $((size / 1048576)) MB (over 1 MB)"$'\n'
		continue
	fi
	# The first four bytes, as hex: ELF, Mach-O (32/64-bit, both byte
	# orders, universal), PE (MZ) and WebAssembly.
	magic=$(head -c 4 -- "$f" | od -An -tx1 | tr -d ' \n')
	case "$magic" in
	7f454c46 | feedface | feedfacf | cefaedfe | cffaedfe | cafebabe | 4d5a* | 0061736d)
		bad+="  $f: an executable binary (magic $magic)"$'\n'
		;;
	esac
done < <(git ls-files -z)
if [ -n "$bad" ]; then
	log "tracked files that do not belong in the repository (git rm --cached them; build output goes to .bin/, which .gitignore ignores):"
	printf '%s' "$bad" >&2
	exit 1
fi

log "gofmt -l ."
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
	log "not gofmt-formatted (run gofmt -w on them):"
	echo "$unformatted" | sed 's/^/  /' >&2
	exit 1
fi

for tags in "" idemfault; do
	log "go vet ${tags:+-tags $tags }./..."
	go vet ${tags:+-tags "$tags"} ./...
done
mapfile -t NESTED < <(git ls-files -- '*/go.mod' | xargs -r -n1 dirname)
for m in "${NESTED[@]}"; do
	log "go vet ./... in $m"
	(cd "$m" && go vet ./...)
done

# staticcheck -version prints e.g. "staticcheck 2026.2.2 (0.8.2)".
if ! "$STATICCHECK" -version 2>/dev/null | grep -qF "(${STATICCHECK_VERSION#v})"; then
	log "installing staticcheck $STATICCHECK_VERSION into .bin/"
	GOBIN="$ROOT/.bin" go install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION"
fi
for tags in "" idemfault; do
	log "staticcheck ${tags:+-tags $tags }./..."
	"$STATICCHECK" ${tags:+-tags "$tags"} ./...
done
for m in "${NESTED[@]}"; do
	log "staticcheck ./... in $m"
	(cd "$m" && "$STATICCHECK" ./...)
done
log "ok"
