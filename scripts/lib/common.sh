# shellcheck shell=bash
# Helpers shared by scripts/test.sh and scripts/lib/<server>.sh.
# Sourced, never executed. Everything prints to stderr; stdout is reserved
# for values returned by functions (pick_port, ...).

log() { printf 'idem-test: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# now: seconds since the epoch with milliseconds, for timing.
now() { date +%s.%3N; }
# elapsed START: seconds since START (from now), one decimal.
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

is_root() { [ "$(id -u)" = 0 ]; }

# run_as USER CMD...: run CMD as USER when we are root, else as ourselves
# (a non-root developer can only run servers as himself anyway).
run_as() {
	local user=$1; shift
	if is_root && [ -n "$user" ]; then
		runuser -u "$user" -- "$@"
	else
		"$@"
	fi
}

# check_reachable USER DIR: die unless USER can write in DIR (all its
# parents must be searchable by USER: not the case under /root, say).
check_reachable() {
	[ -n "$1" ] || return 0
	run_as "$1" test -w "$2" ||
		die "user $1 cannot reach $2: put IDEM_TEST_DIR (or TMPDIR) under a world-searchable directory such as /tmp"
}

# ---------------------------------------------------------------------------
# Debian packages

# pkg_installed PKG: true if dpkg knows PKG as installed.
pkg_installed() {
	[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}

# ensure_packages PKG...: install the missing ones, with a single
# `apt-get update` first, and nothing at all when everything is there.
ensure_packages() {
	local missing=() p
	for p in "$@"; do
		pkg_installed "$p" || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	command -v apt-get >/dev/null || die "missing packages (${missing[*]}) and no apt-get: install them by hand"
	local sudo=()
	if ! is_root; then
		command -v sudo >/dev/null || die "missing packages (${missing[*]}): run as root or install them by hand"
		sudo=(sudo -n)
	fi
	local t0; t0=$(now)
	log "installing Debian packages: ${missing[*]} ..."
	local apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q -y
		-o DPkg::Lock::Timeout=300 -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
	local aptlog; aptlog=$(mktemp /tmp/idem-test-apt.XXXXXX)
	if ! "${apt[@]}" update >"$aptlog" 2>&1; then
		tail -n 20 "$aptlog" >&2
		log "warning: apt-get update failed, trying to install anyway"
	fi
	if ! "${apt[@]}" install --no-install-recommends "${missing[@]}" >>"$aptlog" 2>&1 </dev/null; then
		tail -n 40 "$aptlog" >&2
		rm -f "$aptlog"
		die "apt-get install ${missing[*]} failed"
	fi
	rm -f "$aptlog"
	log "installed ${missing[*]} in $(elapsed "$t0")s"
}

# sweep_servers DIR: kill every server process of ours that belongs to the
# test directory DIR, found by its command line (postgres -D DIR/...,
# mariadbd --defaults-file=DIR/..., beam.smp -home DIR/...) or, for epmd,
# its environment. A safety net after the pid-file based stops: it works
# even when DIR's files are gone.
sweep_servers() {
	local d=${1%/}/ p pid comm text sig pids=()
	for p in /proc/[0-9]*; do
		comm=$(cat "$p/comm" 2>/dev/null) || continue
		case "$comm" in
		postgres | mariadbd | mysqld | beam.smp) text=$(tr '\0' ' ' 2>/dev/null <"$p/cmdline" || true) ;;
		epmd) text=$(tr '\0' ' ' 2>/dev/null <"$p/environ" || true) ;;
		*) continue ;;
		esac
		[[ $text == *"$d"* ]] || continue
		pid=${p#/proc/}
		[ "$comm" = postgres ] && sig=QUIT || sig=TERM
		kill -"$sig" "$pid" 2>/dev/null && pids+=("$pid")
	done
	[ ${#pids[@]} -gt 0 ] || return 0
	log "killed leftover server processes of $d: ${pids[*]}"
	sleep 1
	for pid in "${pids[@]}"; do
		pid_alive "$pid" && kill -KILL "$pid" 2>/dev/null
	done
	return 0
}

# ---------------------------------------------------------------------------
# Test directories and their owners

# owner_alive DIR: true if the run that owns the test directory DIR (the
# script whose PID and start time are in DIR/owner) is still running.
owner_alive() {
	local pid start
	read -r pid start 2>/dev/null <"$1/owner" || return 1
	pid_alive "$pid" && [ "$(pid_start_time "$pid")" = "$start" ]
}

# ---------------------------------------------------------------------------
# Ports
#
# Several runs may share the machine (developers, CI). A run picks its ports
# and starts each server while holding a machine-wide lock, and claims the
# ports it picked with a file $IDEM_PORTS_DIR/PORT naming its test directory,
# until it ends. A port claimed by a live run is never taken by another, even
# while a test has stopped that server to restart it. The preferred ports are
# below the kernel's ephemeral range (32768-60999), so that client sockets
# never take them while a server is down for a restart.

IDEM_PORTS_DIR=${TMPDIR:-/tmp}/idem-test-ports

# ports_lock / ports_unlock: the machine-wide lock (fd 9). Commands that
# start a server while it is held must close fd 9 (`9>&-`), or the server
# would hold the lock for its whole life.
ports_lock() {
	if [ ! -d "$IDEM_PORTS_DIR" ]; then
		mkdir -p "$IDEM_PORTS_DIR"
		chmod 1777 "$IDEM_PORTS_DIR" 2>/dev/null || true
	fi
	exec 9>>"$IDEM_PORTS_DIR/.lock"
	chmod 666 "$IDEM_PORTS_DIR/.lock" 2>/dev/null || true
	if ! flock -n 9; then
		log "waiting for another test run to start its servers ..."
		flock -w 600 9 || die "timed out waiting for $IDEM_PORTS_DIR/.lock"
	fi
}
ports_unlock() {
	flock -u 9 2>/dev/null || true
	exec 9>&-
}

# port_claimed PORT: true if a live run (this one included) claimed PORT.
port_claimed() {
	local owner
	owner=$(cat "$IDEM_PORTS_DIR/$1" 2>/dev/null) || return 1
	[ -n "$owner" ] || return 1
	[ "$owner" = "$IDEM_TEST_DIR" ] || owner_alive "$owner"
}

# release_ports DIR: drop the claims of the run that used DIR.
release_ports() {
	local f
	for f in "$IDEM_PORTS_DIR"/[0-9]*; do
		[ -f "$f" ] && [ "$(cat "$f" 2>/dev/null)" = "$1" ] && rm -f "$f"
	done
	return 0
}

# port_free PORT: true if we can bind 127.0.0.1:PORT (with SO_REUSEADDR,
# like the servers do). Linux refuses the bind when anything listens on that
# port on 127.0.0.1 or on the wildcard address.
port_free() {
	perl -MIO::Socket::INET -e '
		my $s = IO::Socket::INET->new(LocalAddr => "127.0.0.1", LocalPort => $ARGV[0],
			Proto => "tcp", ReuseAddr => 1, Listen => 1);
		exit($s ? 0 : 1);' "$1" 2>/dev/null
}

# pick_port PREFERRED: claim and print PREFERRED if it is free and not
# claimed, else the next such port after it (up to 200 tries), else one the
# kernel chooses. Call it with the ports lock held.
pick_port() {
	local port=$1 i
	for ((i = 0; i < 200; i++, port++)); do
		port_claimed "$port" && continue
		port_free "$port" || continue
		echo "$IDEM_TEST_DIR" >"$IDEM_PORTS_DIR/$port"
		echo "$port"
		return 0
	done
	for i in 1 2 3 4 5; do
		port=$(perl -MIO::Socket::INET -e '
			my $s = IO::Socket::INET->new(LocalAddr => "127.0.0.1", LocalPort => 0,
				Proto => "tcp", Listen => 1) or exit 1;
			print $s->sockport, "\n";') || continue
		port_claimed "$port" && continue
		echo "$IDEM_TEST_DIR" >"$IDEM_PORTS_DIR/$port"
		echo "$port"
		return 0
	done
	die "cannot find a free TCP port"
}

# ---------------------------------------------------------------------------
# Generated helper scripts

# gen_script PATH NAME=VALUE...: write an executable bash script to PATH:
# a header assigning each NAME=VALUE (shell-quoted), then the body read from
# stdin. The scripts are self-contained, so tests can run them directly.
gen_script() {
	local path=$1 kv; shift
	{
		echo '#!/usr/bin/env bash'
		echo '# Generated by scripts/test.sh for this test run only.'
		echo 'set -euo pipefail'
		# alive PID: a live process (not a zombie waiting to be reaped).
		echo 'alive() { kill -0 "$1" 2>/dev/null && [ "$(cut -d" " -f3 "/proc/$1/stat" 2>/dev/null)" != Z ]; }'
		for kv in "$@"; do
			printf '%s=%q\n' "${kv%%=*}" "${kv#*=}"
		done
		cat
	} >"$path"
	chmod 755 "$path"
}

# ---------------------------------------------------------------------------
# Processes

# pid_alive PID: true if PID is a live (non-zombie) process.
pid_alive() {
	[ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null || return 1
	local state
	state=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) || return 1
	[ "$state" != Z ]
}

# pid_start_time PID: the process start time (clock ticks since boot), to
# tell a live owner from a recycled PID.
pid_start_time() { awk '{ print $22 }' "/proc/$1/stat" 2>/dev/null; }

# kill_owned PID MARK [SIGNAL]: kill PID (SIGNAL first, default TERM, then
# KILL after 15 s) but only if its command line mentions MARK (a path of
# our test directory), so that a recycled PID is never killed.
kill_owned() {
	local pid=$1 mark=$2 sig=${3:-TERM} i
	pid_alive "$pid" || return 0
	local cmd
	cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" || true)
	[[ $cmd == *"$mark"* ]] || return 0
	kill -"$sig" "$pid" 2>/dev/null || true
	for ((i = 0; i < 150; i++)); do
		pid_alive "$pid" || return 0
		sleep 0.1
	done
	log "process $pid did not stop on SIG$sig, killing it"
	kill -KILL "$pid" 2>/dev/null || true
}
