#!/usr/bin/env bash
# make lint: the checks every change must pass, in the order a failure is
# cheapest to read:
#   1. gofmt -l prints nothing (run `gofmt -w .` to fix);
#   2. go vet, with and without the idemfault build tag (internal/fault has
#      a file for each);
#   3. staticcheck, with and without the tag, at STATICCHECK_VERSION,
#      installed with `go install` into .bin/ the first time (the Go module
#      proxy must be reachable then). Its checks are staticcheck's defaults;
#      staticcheck.conf, if present, lists exclusions and why.
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

# staticcheck -version prints e.g. "staticcheck 2026.2.2 (0.8.2)".
if ! "$STATICCHECK" -version 2>/dev/null | grep -qF "(${STATICCHECK_VERSION#v})"; then
	log "installing staticcheck $STATICCHECK_VERSION into .bin/"
	GOBIN="$ROOT/.bin" go install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION"
fi
for tags in "" idemfault; do
	log "staticcheck ${tags:+-tags $tags }./..."
	"$STATICCHECK" ${tags:+-tags "$tags"} ./...
done
log "ok"
