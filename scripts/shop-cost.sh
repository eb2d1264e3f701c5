#!/usr/bin/env bash
# The cost of an order, side by side: starts each shop binary given on the
# servers of scripts/test.sh, runs `shopctl load` (internal/tools/shopctl,
# built from this working tree) against it with --pids (PostgreSQL's
# postmaster, RabbitMQ's beam.smp, the shop), --admin and --db, and prints
# each report. Binaries run in the order given: interleave them (a b a b)
# for a comparison.
#
# Usage (from the module root):
#   go build -o /tmp/shop-new ./cmd/shop
#   git worktree add --detach /tmp/shop-base main && (cd /tmp/shop-base && go build -o /tmp/shop-base.bin ./cmd/shop)
#   IDEM_TEST_SHELL=1 IDEM_TEST_SERVERS="postgres rabbitmq" \
#     IDEM_TEST_CMD='bash scripts/shop-cost.sh before:/tmp/shop-base.bin after:/tmp/shop-new -- --orders 3000 --rate 200 --concurrency 16 --retry-rate 0.05' \
#     bash scripts/test.sh
#
# Everything after -- goes to `shopctl load`, the same for every binary.
# Each run uses a fresh namespace; STMTS=N also prints the N most called
# statements of each run (pg_stat_statements, reset before it).
#
# EMBEDDED=1 measures the embedded defaults instead (SQLite files and the
# in-process NATS server, in a fresh --data-dir per run; no server needed,
# --pids is the shop alone):
#   EMBEDDED=1 bash scripts/shop-cost.sh before:/tmp/shop-base.bin after:/tmp/shop-new -- --rates 10,25,50,100,200,0 --orders 3000
set -euo pipefail
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if [ -n "${EMBEDDED:-}" ]; then
	pg="" pgpid="" rmqpid=""
else
	: "${IDEM_TEST_POSTGRES_URL:?run under scripts/test.sh with IDEM_TEST_SERVERS including postgres, or set EMBEDDED=1}"
	: "${IDEM_TEST_AMQP_URL:?run under scripts/test.sh with IDEM_TEST_SERVERS including rabbitmq, or set EMBEDDED=1}"
	psql=$(command -v psql || ls /usr/lib/postgresql/*/bin/psql | tail -n 1)
	pg=$IDEM_TEST_POSTGRES_URL
	pgpid=$(head -n 1 "$IDEM_TEST_DIR/postgres/data/postmaster.pid")
	rmqpid=$(cat "$IDEM_TEST_DIR/rabbitmq/rabbitmq.pid")
fi
specs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do specs+=("$1"); shift; done
[ $# -gt 0 ] && shift
[ ${#specs[@]} -gt 0 ] || { echo "usage: shop-cost.sh LABEL:BINARY... -- shopctl load flags" >&2; exit 2; }
go build -o "$out/shopctl" ./internal/tools/shopctl
loader="$out/shopctl"
for spec in "${specs[@]}"; do
	label=${spec%%:*} bin=${spec#*:} ns="cost_${spec%%:*}_$RANDOM"
	if [ -n "${EMBEDDED:-}" ]; then
		data="$out/data_$ns"
		"$bin" --data-dir "$data" --http 127.0.0.1:18181 \
			--admin-addr 127.0.0.1:18182 --summary 0 --log-level warn >"$out/shop.out" 2>"$out/shop.err" &
		spid=$!
		db="sqlite:$data" pids="$spid" ns=shop
	else
		"$bin" --db "$pg" --broker "$IDEM_TEST_AMQP_URL" --namespace "$ns" --http 127.0.0.1:18181 \
			--admin-addr 127.0.0.1:18182 --max-conns 32 --summary 0 --log-level warn >"$out/shop.out" 2>"$out/shop.err" &
		spid=$!
		db="$pg" pids="$pgpid,$rmqpid,$spid"
	fi
	for _ in $(seq 300); do grep -q "shop: ready" "$out/shop.out" && break; sleep 0.1; done
	grep -q "shop: ready" "$out/shop.out" || { cat "$out/shop.err" >&2; kill "$spid"; exit 1; }
	sleep 2 # the start-up's own work
	[ -n "$pg" ] && { "$psql" -X -q "$pg" -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" -c "SELECT pg_stat_statements_reset()" >/dev/null 2>&1 || true; }
	echo "=== $label ($bin) load average $(cut -d' ' -f1-3 /proc/loadavg) $*"
	"$loader" load --url http://127.0.0.1:18181 --admin 127.0.0.1:18182 --pids "$pids" \
		--db "$db" --namespace "$ns" "$@"
	if [ -n "${STMTS:-}" ] && [ -n "$pg" ]; then
		"$psql" -X "$pg" -c "SELECT calls, round(total_exec_time::numeric) AS ms, left(regexp_replace(query, '\s+', ' ', 'g'), 110) AS query
			FROM pg_stat_statements ORDER BY calls DESC LIMIT ${STMTS}"
	fi
	kill -TERM "$spid"
	wait "$spid" || true
done
