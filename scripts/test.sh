#!/usr/bin/env bash
# Run all tests of the module with the servers they need: `make test` calls
# this script, and so does .ci/run.
#
# Usage:
#   bash scripts/test.sh                     # go test -race -tags idemfault -count=1 ./...
#                                            # in the root module, then in each nested one
#   bash scripts/test.sh -run TestX ./inbox/ # go test -race -tags idemfault -count=1 -run TestX ./inbox/
#   make test ARGS='-run TestX ./inbox/'     # the same through make
#   make test ARGS='-run TestManifests ./deploy/validate/'   # a test of deploy/validate
#
# The nested modules, found by their go.mod (deploy/validate needs
# k8s.io/api, internal/mysql8test vitess: modules of their own, which the
# library must not require), run as the root's packages do: arguments naming
# one (./deploy/validate, ./internal/mysql8test/...) run in it, with the
# other flags; a pattern holding a nested module's directory (./...,
# ./deploy/..., ./internal/...) runs in the root module and in it whole;
# the other packages named, if any, run in the root module.
#
# -tags idemfault compiles in the fault points (internal/fault) that the
# crash tests kill processes at; the tests that need them fail without it.
#
# What it does: installs the missing Debian packages (apt-get, as root),
# starts private servers on 127.0.0.1 with their data in a temporary
# directory (never the system's default clusters or services), exports their
# connection URLs, runs go test, then stops the servers and removes the
# directory, whatever happened (EXIT/INT/TERM). The exit status is go test's
# (of the last run that failed, when several modules run).
# Leftovers of a killed earlier run (/tmp/idem-test.*) are cleaned first.
#
# Environment:
#   IDEM_TEST_SERVERS  servers to start, among: postgres mariadb rabbitmq
#                      chromium podman (default: all five; "" for none;
#                      chromium is the headless browser of the dashboard's
#                      test, podman the container engine of the images'
#                      tests: nothing to start, each is installed and its
#                      path exported, podman with a store of its own in
#                      IDEM_TEST_DIR)
#   IDEM_TEST_DIR      the directory for the servers' data, logs and helper
#                      scripts (default: a new /tmp/idem-test.XXXXXX)
#   IDEM_TEST_KEEP=1   keep IDEM_TEST_DIR (logs...) after the run
#   IDEM_TEST_START_TIMEOUT  seconds to wait for each server (default 120)
#   IDEM_TEST_POSTGRES_PORT / IDEM_TEST_MARIADB_PORT / IDEM_TEST_RABBITMQ_PORT
#                      preferred ports (15432 / 13306 / 15682; RabbitMQ also
#                      takes the next port for Erlang distribution and 14369
#                      for its own epmd); the next free port is taken when one
#                      is busy or claimed by another run on the machine
#   IDEM_TEST_MARIADB_BINLOG=0  run MariaDB without its binary log (on by
#                      default, in row format, for the binlog relay's tests)
#   IDEM_TEST_SHELL=1  developer mode: instead of go test, run
#                      ${SHELL:-bash} -c "$IDEM_TEST_CMD" with the servers up
#                      and the variables below set (an interactive shell when
#                      IDEM_TEST_CMD is empty), e.g.
#       IDEM_TEST_SHELL=1 IDEM_TEST_SERVERS="postgres mariadb rabbitmq" \
#       IDEM_TEST_CMD='psql "$IDEM_TEST_POSTGRES_URL" -c "select 1"' bash scripts/test.sh
#
# Exported to the tests (each only when its server is started):
#   IDEM_TEST_DIR
#   postgres: IDEM_TEST_POSTGRES_URL (postgres://postgres@127.0.0.1:PORT/idem_test?sslmode=disable),
#             IDEM_TEST_POSTGRES_STOP, IDEM_TEST_POSTGRES_START (scripts),
#             IDEM_TEST_POSTGRES_BINDIR (the server's bin directory, with psql)
#   mariadb:  IDEM_TEST_MARIADB_URL (mysql://idem:idem@127.0.0.1:PORT/idem_test),
#             IDEM_TEST_MARIADB_DSN (idem:idem@tcp(127.0.0.1:PORT)/idem_test),
#             IDEM_TEST_MARIADB_STOP, IDEM_TEST_MARIADB_START (scripts)
#   chromium: IDEM_TEST_CHROMIUM (/usr/bin/chromium)
#   podman:   IDEM_TEST_PODMAN (/usr/bin/podman), CONTAINERS_CONF,
#             CONTAINERS_STORAGE_CONF (its configuration and store, under
#             IDEM_TEST_DIR/podman: scripts/lib/podman.sh says which)
#   rabbitmq: IDEM_TEST_AMQP_URL (amqp://guest:guest@127.0.0.1:PORT/),
#             IDEM_TEST_RABBITMQ_NODE, IDEM_TEST_RABBITMQCTL (rabbitmqctl
#             wrapper for the node), IDEM_TEST_RABBITMQ_ENV (file to source),
#             IDEM_TEST_RABBITMQ_STOP, IDEM_TEST_RABBITMQ_START (scripts)
# The STOP/START scripts stop/start the same server with the same data and
# port (START waits until it is ready); both are no-ops when already done.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LIB=$ROOT/scripts/lib
# shellcheck source=scripts/lib/common.sh
. "$LIB/common.sh"
# shellcheck source=scripts/lib/postgres.sh
. "$LIB/postgres.sh"
# shellcheck source=scripts/lib/mariadb.sh
. "$LIB/mariadb.sh"
# shellcheck source=scripts/lib/rabbitmq.sh
. "$LIB/rabbitmq.sh"
# shellcheck source=scripts/lib/chromium.sh
. "$LIB/chromium.sh"
# shellcheck source=scripts/lib/podman.sh
. "$LIB/podman.sh"

ALL_SERVERS="postgres mariadb rabbitmq chromium podman"
export PATH="/usr/local/go/bin${HOME:+:$HOME/go/bin}:$PATH:/usr/sbin:/sbin"

# ---------------------------------------------------------------------------
# Which servers

read -r -a SERVERS <<<"${IDEM_TEST_SERVERS-$ALL_SERVERS}"
for s in "${SERVERS[@]}"; do
	case " $ALL_SERVERS " in
	*" $s "*) ;;
	*) die "unknown server '$s' in IDEM_TEST_SERVERS (known: $ALL_SERVERS)" ;;
	esac
done

# ---------------------------------------------------------------------------
# Leftovers of killed runs: a test directory whose owner (the script that
# made it) is gone. Its servers are killed and the directory removed.

clean_stale_dir() {
	local d=$1 s
	[ -f "$d/owner" ] || return 0
	owner_alive "$d" && return 0
	log "cleaning up after a killed run: $d"
	for s in $ALL_SERVERS; do "${s}_stale" "$d" || true; done
	sweep_servers "$d"
	release_ports "$d"
	rm -rf "$d"
}

for d in "${TMPDIR:-/tmp}"/idem-test.*; do
	[ -d "$d" ] && clean_stale_dir "$d"
done

# ---------------------------------------------------------------------------
# Test directory and cleanup

KEEP_DIR_ITSELF=

if [ -n "${IDEM_TEST_DIR:-}" ]; then
	if [ -d "$IDEM_TEST_DIR" ]; then
		owner_alive "$IDEM_TEST_DIR" && die "IDEM_TEST_DIR=$IDEM_TEST_DIR is in use by a running test (pid $(cut -d' ' -f1 "$IDEM_TEST_DIR/owner"))"
		clean_stale_dir "$IDEM_TEST_DIR"
	fi
	if [ -d "$IDEM_TEST_DIR" ]; then
		# Then only what we create inside it is removed at the end.
		[ -z "$(ls -A "$IDEM_TEST_DIR")" ] || die "IDEM_TEST_DIR=$IDEM_TEST_DIR is not empty"
		KEEP_DIR_ITSELF=1
	fi
	mkdir -p "$IDEM_TEST_DIR"
	IDEM_TEST_DIR=$(cd "$IDEM_TEST_DIR" && pwd)
else
	IDEM_TEST_DIR=$(mktemp -d "${TMPDIR:-/tmp}/idem-test.XXXXXX")
fi
export IDEM_TEST_DIR
# The postgres and mysql users must reach their directories inside.
chmod 755 "$IDEM_TEST_DIR"
echo "$$ $(pid_start_time $$)" >"$IDEM_TEST_DIR/owner"

STARTED=()
GOTEST_PID=
cleanup() {
	local rc=$? i
	trap - EXIT INT TERM
	set +e
	ports_unlock
	if [ -n "$GOTEST_PID" ] && kill -0 -- -"$GOTEST_PID" 2>/dev/null; then
		# Interrupted: stop go test and its test binaries (its process group).
		log "interrupting go test ..."
		kill -INT -- -"$GOTEST_PID" 2>/dev/null
		for ((i = 0; i < 100; i++)); do
			kill -0 -- -"$GOTEST_PID" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL -- -"$GOTEST_PID" 2>/dev/null
		wait "$GOTEST_PID" 2>/dev/null
	fi
	for ((i = ${#STARTED[@]} - 1; i >= 0; i--)); do
		log "stopping ${STARTED[i]} ..."
		"${STARTED[i]}_stop"
	done
	# Whatever is left (an interrupted start-up...).
	for s in $ALL_SERVERS; do "${s}_stale" "$IDEM_TEST_DIR"; done
	sweep_servers "$IDEM_TEST_DIR"
	release_ports "$IDEM_TEST_DIR"
	if [ "${IDEM_TEST_KEEP:-}" = 1 ]; then
		log "kept $IDEM_TEST_DIR"
	else
		if [ -n "${KEEP_DIR_ITSELF:-}" ]; then
			find "$IDEM_TEST_DIR" -mindepth 1 -maxdepth 1 -exec rm -rf {} +
		else
			rm -rf "$IDEM_TEST_DIR"
		fi
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------------------
# Packages, then servers

command -v go >/dev/null || die "go not found (expected in /usr/local/go/bin)"
PKGS=()
# -race needs cgo, so a C compiler.
command -v gcc >/dev/null || PKGS+=(gcc libc6-dev)
for s in "${SERVERS[@]}"; do
	read -r -a p <<<"$("${s}_packages")"
	PKGS+=("${p[@]}")
done
[ ${#PKGS[@]} -eq 0 ] || ensure_packages "${PKGS[@]}"

for s in "${SERVERS[@]}"; do
	STARTED+=("$s")
	# One server start at a time on the machine: see "Ports" in common.sh.
	ports_lock
	"${s}_start"
	ports_unlock
done

if [ ${#SERVERS[@]} -gt 0 ]; then
	log "environment for the tests:"
	env | grep -E '^IDEM_TEST_' | grep -vE '^IDEM_TEST_(CMD|SHELL)=' | sort | sed 's/^/idem-test:   /' >&2
fi

# ---------------------------------------------------------------------------
# Tests

cd "$ROOT"
if [ "${IDEM_TEST_SHELL:-}" = 1 ]; then
	if [ -n "${IDEM_TEST_CMD:-}" ]; then
		log "running: ${SHELL:-bash} -c \"$IDEM_TEST_CMD\""
		set +e
		"${SHELL:-bash}" -c "$IDEM_TEST_CMD"
	else
		log "servers are up: starting ${SHELL:-bash}; exit it to stop them"
		set +e
		"${SHELL:-bash}"
	fi
	rc=$?
else
	# The arguments naming a nested module go to it; with none, every
	# module runs whole.
	if [ $# -eq 0 ]; then
		set -- ./...
	fi
	mapfile -t NESTED < <(git -C "$ROOT" ls-files -- '*/go.mod' | xargs -r -n1 dirname)
	declare -A MOD_ARGS=() MOD_RUN=()
	ROOT_ARGS='' root_pkgs=0
	for a in "$@"; do
		q=$(printf '%q' "$a")
		case "$a" in
		./* | ../* | .)
			in_nested=0
			for m in "${NESTED[@]}"; do
				case "$a" in
				"./$m" | "./$m/" | "./$m/...")
					MOD_ARGS[$m]+=' ./...' MOD_RUN[$m]=1 in_nested=1
					;;
				"./$m/"*)
					MOD_ARGS[$m]+=" $(printf '%q' "./${a#"./$m/"}")" MOD_RUN[$m]=1 in_nested=1
					;;
				*/...)
					# A pattern holding the module's directory: it runs whole.
					case "./$m/" in
					"${a%...}"*) MOD_ARGS[$m]+=' ./...' MOD_RUN[$m]=1 ;;
					esac
					;;
				esac
			done
			if [ "$in_nested" = 0 ]; then
				ROOT_ARGS+=" $q" root_pkgs=1
			fi
			;;
		*)
			ROOT_ARGS+=" $q"
			for m in "${NESTED[@]}"; do
				MOD_ARGS[$m]+=" $q"
			done
			;;
		esac
	done
	# A run naming no package at all tests the root module's current
	# directory, as go test does.
	[ "${#MOD_RUN[@]}" -gt 0 ] || root_pkgs=1
	GOTEST='go test -race -tags idemfault -count=1 -timeout 30m'
	runs=()
	[ "$root_pkgs" = 1 ] && runs+=("$GOTEST$ROOT_ARGS")
	for m in "${NESTED[@]}"; do
		[ -n "${MOD_RUN[$m]:-}" ] && runs+=("cd $(printf '%q' "$m") && $GOTEST${MOD_ARGS[$m]}")
	done
	script='rc=0'
	for r in "${runs[@]}"; do
		log "running: $r"
		script+="; ($r) || rc=\$?"
	done
	script+='; exit $rc'
	# In its own process group, in the background, so that a signal to this
	# script is handled at once: cleanup interrupts the whole group (go and
	# the test binaries) before it stops the servers.
	setsid bash -c "$script" </dev/null &
	GOTEST_PID=$!
	rc=0
	wait "$GOTEST_PID" || rc=$?
	GOTEST_PID=
fi
exit "$rc"
