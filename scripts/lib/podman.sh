# shellcheck shell=bash
# Podman: not a server, the container engine the image tests (package
# deploy: TestRelayImage, TestShopImage) build the images with
# (scripts/image.sh) and run them. Nothing to start: "start" checks the
# binaries, writes the one setting podman needs here, and exports podman's
# path.
#
# The setting: podman raises the containers' limits (open files, processes)
# to its defaults, which a machine that runs the tests inside a container of
# its own does not allow ("error setting rlimit type 7: operation not
# permitted"). A drop-in file of containers.conf,
# /etc/containers/containers.conf.d/idem-test.conf (for root; else under
# ~/.config/containers/), sets `default_ulimits = []` under [containers]:
# the containers keep the limits podman has. It is written once and never
# touches containers.conf itself or another drop-in. The tests run the
# containers with `podman --runtime runc` (crun, podman's first choice when
# installed, fails on these machines too: "cgroups in hybrid mode not
# supported").
#
# The tests label their containers and images idem-test-dir=$IDEM_TEST_DIR:
# those of a killed run are removed with its other leftovers.
#
# Exports IDEM_TEST_PODMAN (/usr/bin/podman, or IDEM_TEST_PODMAN when
# already set).

podman_packages() { echo podman runc; }

podman_start() {
	local bin=${IDEM_TEST_PODMAN:-/usr/bin/podman} dir conf
	[ -x "$bin" ] || die "no podman at $bin (apt-get install podman runc, or set IDEM_TEST_PODMAN)"
	command -v runc >/dev/null || die "no runc on PATH: apt-get install runc"
	if is_root; then
		dir=/etc/containers/containers.conf.d
	else
		dir=${XDG_CONFIG_HOME:-$HOME/.config}/containers/containers.conf.d
	fi
	conf=$dir/idem-test.conf
	if ! grep -qx 'default_ulimits = \[\]' "$conf" 2>/dev/null; then
		mkdir -p "$dir"
		cat >"$conf" <<-'EOF'
			# Written by idem's scripts/lib/podman.sh: the containers keep the
			# limits podman has (its defaults are above what this machine allows).
			[containers]
			default_ulimits = []
		EOF
		log "wrote $conf (default_ulimits = [])"
	fi
	export IDEM_TEST_PODMAN=$bin
	log "container engine: $("$bin" --version 2>/dev/null || echo "$bin"), runtime $(runc --version 2>/dev/null | head -n 1)"
}

podman_stop() { :; }

# podman_stale DIR: remove the containers and images a (killed) run that
# used DIR left: the tests label theirs idem-test-dir=DIR.
podman_stale() {
	local bin=${IDEM_TEST_PODMAN:-/usr/bin/podman} ids
	[ -x "$bin" ] || return 0
	ids=$("$bin" ps -a -q --filter "label=idem-test-dir=$1" 2>/dev/null || true)
	if [ -n "$ids" ]; then
		# shellcheck disable=SC2086
		"$bin" rm -f -t 0 $ids >/dev/null 2>&1 || true
	fi
	ids=$("$bin" images -q --filter "label=idem-test-dir=$1" 2>/dev/null | sort -u || true)
	if [ -n "$ids" ]; then
		# shellcheck disable=SC2086
		"$bin" rmi -f $ids >/dev/null 2>&1 || true
	fi
	return 0
}
