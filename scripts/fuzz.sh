#!/usr/bin/env bash
# make fuzz: runs every fuzz target of the module (every `func FuzzXxx` in a
# _test.go file) for FUZZTIME each, one after the other, and stops at the
# first failure. go test then saves the failing input under the package's
# testdata/fuzz/FuzzXxx/: commit it with the fix, and it becomes a seed that
# every `make test` runs.
#
# make fuzz runs this script through scripts/test.sh with a PostgreSQL
# server, since the TestMain of some packages (broker/nats) needs one even
# when only fuzzing.
#
# Environment:
#   FUZZTIME  how long each target runs: a duration (10s, 2m) or a count of
#             inputs (5000x); default 10s
#   FUZZ      a regular expression: only the targets whose name matches
#             (default: all)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export PATH="/usr/local/go/bin${HOME:+:$HOME/go/bin}:$PATH"
FUZZTIME=${FUZZTIME:-10s}
FUZZ=${FUZZ:-.}

# "dir name" per target, sorted.
mapfile -t targets < <(grep -rE --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*\(' . |
	sed -E 's|^\./(.*)/[^/]*_test\.go:func (Fuzz[A-Za-z0-9_]*)\(.*|\1 \2|; s|^\./[^/]*_test\.go:func (Fuzz[A-Za-z0-9_]*)\(.*|. \1|' |
	sort -u)
[ ${#targets[@]} -gt 0 ] || { echo "fuzz: no fuzz target found" >&2; exit 1; }

ran=0
for t in "${targets[@]}"; do
	dir=${t% *} name=${t#* }
	[[ $name =~ $FUZZ ]] || continue
	echo "fuzz: $name in ./$dir for $FUZZTIME" >&2
	go test -tags idemfault -run '^$' -fuzz "^$name\$" -fuzztime "$FUZZTIME" "./$dir"
	ran=$((ran + 1))
done
[ "$ran" -gt 0 ] || { echo "fuzz: no fuzz target matches FUZZ=$FUZZ" >&2; exit 1; }
echo "fuzz: $ran targets passed" >&2
