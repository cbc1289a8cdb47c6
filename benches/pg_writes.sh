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
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${COUNTERSIGN_BIN:-$ROOT/target/release/countersign}
PERF=${PERF_TARGET_DIR:-$HOME/.cache/countersign-perf-target}/release
C=${1:-64}; N=${2:-20000}
[ -x "$BIN" ] && [ -x "$PERF/mcp-stub" ] && [ -x "$PERF/mcp-load" ] || { echo "see the header" >&2; exit 1; }
WORK=$(mktemp -d)
SCHEMA="cs_bench_$$"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  psql -h 127.0.0.1 -U postgres -d test -qc "DROP SCHEMA IF EXISTS $SCHEMA CASCADE" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
psql -h 127.0.0.1 -U postgres -d test -qc "CREATE SCHEMA $SCHEMA" >/dev/null
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
mkdir -p "$WORK/policies"
cp "$ROOT/policies/schema.cedarschema" "$WORK/policies/"
printf '@id("allow-all")\npermit (principal, action, resource);\n' > "$WORK/policies/all.cedar"
TOKEN=perf-token-1
SHA=$(printf %s "$TOKEN" | sha256sum | cut -d' ' -f1)
GPORTS=()
for g in a b; do
  SPORT=$(port); GPORT=$(port); GPORTS+=("$GPORT")
  taskset -c 0 "$PERF/mcp-stub" --port "$SPORT" --quiet >/dev/null & PIDS+=($!)
  cat > "$WORK/$g.toml" <<T
[gateway]
listen = "127.0.0.1:$GPORT"
data_dir = "$WORK/data-$g"
policies = "$WORK/policies"

[store]
url = "postgres://postgres@127.0.0.1:5432/test?options=-c%20search_path%3D$SCHEMA"
pool_size = 32

[servers.stub]
url = "http://127.0.0.1:$SPORT/mcp"

[[identities]]
token_sha256 = "$SHA"
principal = "agent-1"
tenant = "perf"
groups = ["agents"]
T
  taskset -c 0 "$BIN" serve --config "$WORK/$g.toml" >"$WORK/$g.log" 2>&1 & PIDS+=($!)
  for _ in $(seq 100); do grep -qs 'listening on' "$WORK/$g.log" && break; sleep 0.1; done
done
HALF_C=$((C / 2)); HALF_N=$((N / 2))
for i in 0 1; do
  taskset -c 0 "$PERF/mcp-load" --url "http://127.0.0.1:${GPORTS[$i]}/mcp/stub" --header "Authorization: Bearer $TOKEN" \
    --tool charge_card --unique-keys --concurrency "$HALF_C" --requests "$HALF_N" --warmup 100 > "$WORK/r$i.json" &
  LOADS[$i]=$!
done
wait "${LOADS[0]}" "${LOADS[1]}"
jq -s -r '"\((.[0].throughput_calls_per_s + .[1].throughput_calls_per_s)|floor) writes/s from \(.[0].concurrency + .[1].concurrency) clients over two gateways on PostgreSQL; p50 \(.[0].p50_us|floor) / \(.[1].p50_us|floor) us, p99 \(.[0].p99_us|floor) / \(.[1].p99_us|floor) us, errors \(.[0].errors + .[1].errors)"' "$WORK/r0.json" "$WORK/r1.json"
