# shellcheck shell=bash
# Chromium: not a server, a headless browser the dashboard's browser test
# (cmd/shop, TestDashboardInBrowser) drives through chromedp. Each test
# starts its own browser with a profile in its temporary directory and
# closes it, so there is nothing to start or stop here: "start" checks the
# binary and exports its path.
#
# Exports IDEM_TEST_CHROMIUM (the binary; /usr/bin/chromium from Debian's
# chromium package, or IDEM_TEST_CHROMIUM when already set).

chromium_packages() { echo chromium; }

chromium_start() {
	local bin=${IDEM_TEST_CHROMIUM:-/usr/bin/chromium}
	[ -x "$bin" ] || die "no Chromium at $bin (apt-get install chromium, or set IDEM_TEST_CHROMIUM)"
	export IDEM_TEST_CHROMIUM=$bin
	log "headless browser: $("$bin" --version 2>/dev/null || echo "$bin")"
}

chromium_stop() { :; }

chromium_stale() { :; }
