#!/usr/bin/env bash
# Durable writes per second on PostgreSQL: G gateways (release build, two by
# default) on one database, each in front of its own mcp-stub, C clients in
# all split over them, every call a charge_card with a fresh explicit
# idempotency key (so it is reserved, durably dispatched and completed in the
# shared ledger). Every process on CPU 0, PostgreSQL where it runs. Compare
# with one gateway on redb: ../shared/perf/gateway-writes.sh C N.
# Besides writes/s it prints the database's connections at the end of the
# run and the CPU the gateways and the database's backends used per write.
#
#   cargo build --release && ../shared/perf/gateway-ab.sh   # builds mcp-stub and mcp-load once
#   benches/pg_writes.sh [C] [N] [G]                        # C clients (64), N calls in all (20000), G gateways (2)
C=${1:-64}; N=${2:-20000}; G=${3:-2}
source "$(dirname "$0")/lib.sh"
SCHEMA="cs_bench_$$"
PSQL=(psql -h 127.0.0.1 -U postgres -d test -qAtc)
trap 'bench_cleanup; [ -n "${KEEP_SCHEMA:-}" ] || "${PSQL[@]}" "DROP SCHEMA IF EXISTS $SCHEMA CASCADE" >/dev/null 2>&1 || true' EXIT
"${PSQL[@]}" "CREATE SCHEMA $SCHEMA" >/dev/null
allow_all "$WORK/policies"
GPORTS=(); GPIDS=()
for g in $(seq 1 "$G"); do
  SPORT=$(port); GPORT=$(port); GPORTS+=("$GPORT")
  stub "$SPORT"
  gateway "g$g" "$GPORT" "$WORK/policies" "$SPORT" "" "
[store]
url = \"postgres://postgres@127.0.0.1:5432/test?options=-c%20search_path%3D$SCHEMA\"
pool_size = 32"
  GPIDS+=("${PIDS[-1]}")
done
# CPU ticks (user + system) of the gateways, and of every backend of the database.
ticks() { local t=0; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }
backends() { pgrep -f 'postgres: .*postgres test' | tr '\n' ' '; }
G0=$(ticks "${GPIDS[@]}"); BPIDS=$(backends); B0=$(ticks $BPIDS)
LOADS=()
for i in $(seq 0 $((G - 1))); do
  taskset -c 0 "$PERF/mcp-load" --url "http://127.0.0.1:${GPORTS[$i]}/mcp/stub" --header "Authorization: Bearer $TOKEN" \
    --tool charge_card --unique-keys --concurrency $((C / G)) --requests $((N / G)) --warmup 100 > "$WORK/r$i.json" &
  LOADS+=($!)
done
wait "${LOADS[@]}"
# The pools open connections as the load needs them: count every backend
# there now (those there before keep their earlier ticks in B0).
G1=$(ticks "${GPIDS[@]}"); B1=$(ticks $(backends))
CONNS=$("${PSQL[@]}" "SELECT count(*) FROM pg_stat_activity WHERE datname = 'test' AND pid <> pg_backend_pid()")
HZ=$(getconf CLK_TCK)
jq -s -r --arg g "$G" --arg conns "$CONNS" --argjson gt $((G1 - G0)) --argjson bt $((B1 - B0)) --argjson hz "$HZ" --argjson n "$N" \
  '"\((map(.throughput_calls_per_s) | add) | floor) writes/s from \(map(.concurrency) | add) clients over \($g) gateway(s) on PostgreSQL; p50 \(map(.p50_us | floor) | join(" / ")) us, p99 \(map(.p99_us | floor) | join(" / ")) us, errors \(map(.errors) | add); \($conns) database connections; CPU per write: gateways \($gt / $hz / $n * 1e6 | floor) us, database backends \($bt / $hz / $n * 1e6 | floor) us"' \
  "$WORK"/r*.json
