# shellcheck shell=bash
# Podman: not a server, the container engine the image tests (package
# deploy: TestRelayImage, TestShopImage) build the images with
# (scripts/image.sh) and run them. Nothing to start: "start" gives podman a
# configuration and a store of its own in the test directory, checks that
# it runs, and exports them.
#
# Everything podman keeps is under $IDEM_TEST_DIR/podman: its images and
# containers (storage.conf: graphroot, runroot), its run-time state, events
# and network configuration (containers.conf). The machine's configuration
# (/etc/containers, /etc/cni) and store (/var/lib/containers) are neither
# read nor written, and the directory goes with the test directory.
# CONTAINERS_CONF names the only containers.conf podman reads, so the
# machine's drop-ins do not apply either. The settings:
#   - the vfs storage driver: plain copies, no mount, so it works on any
#     file system (overlay does not over overlayfs, the root of many CI
#     containers) and the directory is removed with rm -rf; the images are a
#     few files FROM scratch, so copies are cheap;
#   - pull_policy = "never": the images are built FROM scratch and run by
#     name, nothing is ever downloaded;
#   - runtime runc: crun, podman's first choice when installed, fails on
#     these machines ("cgroups in hybrid mode not supported");
#   - default_ulimits = []: podman raises the containers' limits (open
#     files, processes) to its defaults, which a machine that runs the tests
#     inside a container of its own does not allow ("error setting rlimit
#     type 7: operation not permitted"); the containers keep podman's.
#
# Exports IDEM_TEST_PODMAN (/usr/bin/podman, or IDEM_TEST_PODMAN when
# already set), CONTAINERS_CONF and CONTAINERS_STORAGE_CONF (the files
# above, read by every podman the tests run).

podman_packages() { echo podman runc; }

podman_start() {
	local bin=${IDEM_TEST_PODMAN:-/usr/bin/podman} dir=$IDEM_TEST_DIR/podman out
	[ -x "$bin" ] || die "no podman at $bin (apt-get install podman runc, or set IDEM_TEST_PODMAN)"
	command -v runc >/dev/null || die "no runc on PATH: apt-get install runc"
	mkdir -p "$dir/storage" "$dir/run" "$dir/tmp" "$dir/networks"
	cat >"$dir/storage.conf" <<-EOF
		# Written by idem's scripts/lib/podman.sh for the tests.
		[storage]
		driver = "vfs"
		graphroot = "$dir/storage"
		runroot = "$dir/run"
	EOF
	cat >"$dir/containers.conf" <<-EOF
		# Written by idem's scripts/lib/podman.sh for the tests.
		[containers]
		default_ulimits = []

		[engine]
		runtime = "runc"
		pull_policy = "never"
		tmp_dir = "$dir/tmp"
		events_logger = "file"
		events_logfile_path = "$dir/events.log"

		[network]
		network_config_dir = "$dir/networks"
	EOF
	export IDEM_TEST_PODMAN=$bin CONTAINERS_CONF=$dir/containers.conf CONTAINERS_STORAGE_CONF=$dir/storage.conf
	# A machine where podman cannot run fails here, not in the tests.
	out=$("$bin" info --format '{{.Store.GraphDriverName}} {{.Host.OCIRuntime.Name}}' 2>&1) ||
		die "podman does not run here (with $CONTAINERS_CONF, $CONTAINERS_STORAGE_CONF):
$out"
	[ "$out" = "vfs runc" ] || die "podman ignores its test configuration: driver and runtime '$out', want 'vfs runc'"
	log "container engine: $("$bin" --version), runtime $(runc --version | head -n 1), store in $dir"
}

podman_stop() { podman_stale "$IDEM_TEST_DIR"; }

# podman_stale DIR: remove the containers (stopping them) and images of
# the run that used DIR, through podman, which can remove what a
# container's user owns; the directory itself goes with DIR.
podman_stale() {
	local bin=${IDEM_TEST_PODMAN:-/usr/bin/podman} dir=$1/podman
	[ -x "$bin" ] && [ -f "$dir/containers.conf" ] && [ -f "$dir/storage.conf" ] || return 0
	CONTAINERS_CONF=$dir/containers.conf CONTAINERS_STORAGE_CONF=$dir/storage.conf \
		"$bin" rm -a -f -t 0 >/dev/null 2>&1 || true
	CONTAINERS_CONF=$dir/containers.conf CONTAINERS_STORAGE_CONF=$dir/storage.conf \
		"$bin" rmi -a -f >/dev/null 2>&1 || true
	return 0
}
