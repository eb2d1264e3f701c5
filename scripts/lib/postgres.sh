# shellcheck shell=bash
# PostgreSQL: a private cluster in $IDEM_TEST_DIR/postgres, run by the
# `postgres` system user when we are root (PostgreSQL refuses to run as root).
#
# Exports IDEM_TEST_POSTGRES_URL, IDEM_TEST_POSTGRES_STOP, IDEM_TEST_POSTGRES_START,
# IDEM_TEST_POSTGRES_BINDIR (the server's bin directory: psql, pg_ctl...).

postgres_packages() { echo postgresql; }

# postgres_bindir: the newest /usr/lib/postgresql/<version>/bin, unless
# IDEM_TEST_PG_BINDIR says otherwise.
postgres_bindir() {
	if [ -n "${IDEM_TEST_PG_BINDIR:-}" ]; then
		echo "$IDEM_TEST_PG_BINDIR"
		return
	fi
	local d
	d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
	[ -n "$d" ] && [ -x "$d/initdb" ] || die "no PostgreSQL server binaries in /usr/lib/postgresql/*/bin"
	echo "$d"
}

postgres_start() {
	local bin ver dir port user=""
	bin=$(postgres_bindir)
	ver=$(basename "$(dirname "$bin")")
	dir=$IDEM_TEST_DIR/postgres
	is_root && user=postgres
	port=$(pick_port "${IDEM_TEST_POSTGRES_PORT:-15432}")

	log "starting PostgreSQL $ver on 127.0.0.1:$port ..."
	local t0; t0=$(now)
	mkdir -p "$dir/data" "$dir/sock"
	[ -n "$user" ] && chown -R "$user:" "$dir"
	chmod 700 "$dir/data"
	check_reachable "$user" "$dir/data"

	# initdb's --no-sync only skips flushing the fresh files to disk (a
	# throwaway cluster); the server itself runs with fsync on.
	if ! (cd "$dir" && run_as "$user" "$bin/initdb" -D "$dir/data" --auth=trust -U postgres \
		-E UTF8 --no-locale --no-sync >"$dir/initdb.log" 2>&1); then
		tail -n 30 "$dir/initdb.log" >&2
		die "initdb failed"
	fi
	cat >>"$dir/data/postgresql.conf" <<-EOF

		# --- idem test settings (scripts/lib/postgres.sh) ---
		listen_addresses = '127.0.0.1'
		port = $port
		unix_socket_directories = '$dir/sock'
		max_connections = 300
		shared_buffers = 256MB
		wal_level = logical
		# Logical replication (the CDC relay, idem cdc): one slot per outbox
		# read, and the shop's crash table and tests create many at once.
		max_replication_slots = 64
		max_wal_senders = 64
		fsync = on
		logging_collector = off
	EOF
	# pg_stat_statements where installed: shopctl load counts statements per order.
	if [ -f "$bin/../lib/pg_stat_statements.so" ]; then
		echo "shared_preload_libraries = 'pg_stat_statements'" >>"$dir/data/postgresql.conf"
	fi

	gen_script "$IDEM_TEST_DIR/postgres-start" BIN="$bin" DATA="$dir/data" DIR="$dir" \
		LOGFILE="$dir/postgres.log" PORT="$port" RUNAS="$user" \
		TIMEOUT="${IDEM_TEST_START_TIMEOUT:-120}" <<-'EOF'
		# Start the test PostgreSQL (again) with the same data; wait until it
		# accepts connections. Does nothing if it is running already.
		cd "$DIR"
		pg() { if [ -n "$RUNAS" ] && [ "$(id -u)" = 0 ]; then runuser -u "$RUNAS" -- "$@"; else "$@"; fi; }
		if ! pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
			pg "$BIN/pg_ctl" -D "$DATA" -l "$LOGFILE" -w -t "$TIMEOUT" -s start || {
				tail -n 30 "$LOGFILE" >&2; exit 1; }
		fi
		deadline=$((SECONDS + TIMEOUT))
		until "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -t 2; do
			if ((SECONDS >= deadline)); then
				echo "PostgreSQL not ready on port $PORT after ${TIMEOUT}s" >&2
				tail -n 30 "$LOGFILE" >&2
				exit 1
			fi
			sleep 0.1
		done
	EOF
	gen_script "$IDEM_TEST_DIR/postgres-stop" BIN="$bin" DATA="$dir/data" DIR="$dir" \
		RUNAS="$user" TIMEOUT="${IDEM_TEST_START_TIMEOUT:-120}" <<-'EOF'
		# Stop the test PostgreSQL (fast mode: clients are disconnected).
		# Does nothing if it is not running.
		cd "$DIR"
		pg() { if [ -n "$RUNAS" ] && [ "$(id -u)" = 0 ]; then runuser -u "$RUNAS" -- "$@"; else "$@"; fi; }
		if pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
			pg "$BIN/pg_ctl" -D "$DATA" -m fast -w -t "$TIMEOUT" -s stop
		fi
	EOF

	"$IDEM_TEST_DIR/postgres-start" 9>&- || die "PostgreSQL did not start (log: $dir/postgres.log)"
	"$bin/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d postgres \
		-c 'CREATE DATABASE idem_test' >&2 || die "cannot create database idem_test"

	export IDEM_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$port/idem_test?sslmode=disable"
	export IDEM_TEST_POSTGRES_STOP="$IDEM_TEST_DIR/postgres-stop"
	export IDEM_TEST_POSTGRES_START="$IDEM_TEST_DIR/postgres-start"
	export IDEM_TEST_POSTGRES_BINDIR="$bin"
	log "PostgreSQL $ver ready on 127.0.0.1:$port in $(elapsed "$t0")s"
}

postgres_stop() {
	[ -x "$IDEM_TEST_DIR/postgres-stop" ] || return 0
	if ! timeout 60 "$IDEM_TEST_DIR/postgres-stop"; then
		log "PostgreSQL did not stop cleanly; killing it"
		postgres_stale "$IDEM_TEST_DIR"
	fi
}

# postgres_stale DIR: kill the postmaster of a dead run that used DIR.
postgres_stale() {
	local data=$1/postgres/data pid
	[ -f "$data/postmaster.pid" ] || return 0
	pid=$(head -n 1 "$data/postmaster.pid")
	# SIGQUIT: immediate shutdown, children exit with the postmaster.
	kill_owned "$pid" "$data" QUIT
}
