#!/usr/bin/env bash
# Durable writes per second on PostgreSQL: two gateways (release build) on one
# database, each in front of its own mcp-stub, C clients in all split over
# them, every call a charge_card with a fresh explicit idempotency key (so it
# is reserved, durably dispatched and completed in the shared ledger). Every
# process on CPU 0, PostgreSQL where it runs. Compare with one gateway on redb:
# ../shared/perf/gateway-writes.sh C N.
#
#   cargo build --release && ../shared/perf/gateway-ab.sh   # builds mcp-stub and mcp-load once
#   benches/pg_writes.sh [C] [N]                            # C clients (64), N calls in all (20000)
C=${1:-64}; N=${2:-20000}
source "$(dirname "$0")/lib.sh"
SCHEMA="cs_bench_$$"
trap 'bench_cleanup; psql -h 127.0.0.1 -U postgres -d test -qc "DROP SCHEMA IF EXISTS $SCHEMA CASCADE" >/dev/null 2>&1 || true' EXIT
psql -h 127.0.0.1 -U postgres -d test -qc "CREATE SCHEMA $SCHEMA" >/dev/null
allow_all "$WORK/policies"
GPORTS=()
for g in a b; do
  SPORT=$(port); GPORT=$(port); GPORTS+=("$GPORT")
  stub "$SPORT"
  gateway "$g" "$GPORT" "$WORK/policies" "$SPORT" "" "
[store]
url = \"postgres://postgres@127.0.0.1:5432/test?options=-c%20search_path%3D$SCHEMA\"
pool_size = 32"
done
HALF_C=$((C / 2)); HALF_N=$((N / 2))
for i in 0 1; do
  taskset -c 0 "$PERF/mcp-load" --url "http://127.0.0.1:${GPORTS[$i]}/mcp/stub" --header "Authorization: Bearer $TOKEN" \
    --tool charge_card --unique-keys --concurrency "$HALF_C" --requests "$HALF_N" --warmup 100 > "$WORK/r$i.json" &
  LOADS[$i]=$!
done
wait "${LOADS[0]}" "${LOADS[1]}"
jq -s -r '"\((.[0].throughput_calls_per_s + .[1].throughput_calls_per_s)|floor) writes/s from \(.[0].concurrency + .[1].concurrency) clients over two gateways on PostgreSQL; p50 \(.[0].p50_us|floor) / \(.[1].p50_us|floor) us, p99 \(.[0].p99_us|floor) / \(.[1].p99_us|floor) us, errors \(.[0].errors + .[1].errors)"' "$WORK/r0.json" "$WORK/r1.json"
