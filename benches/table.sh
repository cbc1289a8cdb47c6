#!/usr/bin/env bash
# The comparison table of docs/performance.md, from one run: p50, p99 and calls/s
#   reads (echo) at 1, 8 and 32 connections: the stub direct; through a gateway with an allow-all policy;
#     through a gateway with the shipped policies (policies/, read-only tools run unattended);
#   writes (charge_card, a fresh explicit key per call: reserved, durably dispatched, completed) at 1, 16
#     and 64 clients: the stub direct; through the allow-all gateway (under the shipped policies a write
#     waits for a reviewer, so it has no unattended row).
# Every gateway keeps its audit log (it cannot be turned off). Every process on CPU 0, as in the harness.
# PEERS=contextforge adds a row per other gateway, installed from its published release (benches/peers.sh);
# a slow peer is measured with a twentieth of the calls (PEER_SCALE, 0.05).
#
#   cargo build --release && ../shared/perf/gateway-ab.sh   # builds mcp-stub and mcp-load once
#   benches/table.sh [SCALE]      SCALE multiplies the calls per cell (default 1: 2,000 to 16,000)
SCALE=${1:-1}
source "$(dirname "$0")/lib.sh"
SPORT=$(port)
stub "$SPORT"
declare -A GPORT
GPORT[allow]=$(port); GPORT[shipped]=$(port)
allow_all "$WORK/allow-policies"
cp -r "$ROOT/policies" "$WORK/shipped-policies"
gateway allow "${GPORT[allow]}" "$WORK/allow-policies" "$SPORT"
gateway shipped "${GPORT[shipped]}" "$WORK/shipped-policies" "$SPORT"
# cell URL TOOL C N: "p50 µs / p99 µs / calls/s" (HEADER: the bearer token; ARGS: the echo arguments)
cell() {
  local extra=()
  [ "$2" = charge_card ] && extra=(--unique-keys)
  [ -n "${ARGS:-}" ] && extra+=(--args "$ARGS")
  taskset -c 0 "$PERF/mcp-load" --url "$1" --header "${HEADER:-Authorization: Bearer $TOKEN}" --tool "$2" "${extra[@]}" \
    --concurrency "$3" --requests "$4" --warmup 200 \
    | jq -r 'if .errors > 0 then "errors \(.errors)" else "\(.p50_us|floor) / \(.p99_us|floor) / \(.throughput_calls_per_s|floor)" end'
}
row() { # LABEL URL TOOL C1 C2 C3
  local label=$1 url=$2 tool=$3; shift 3
  local out="| $label |"
  for c in "$@"; do out="$out $(cell "$url" "$tool" "$c" "$(awk -v n=$(( c < 8 ? 2000 : c * 500 )) -v s="$SCALE" 'BEGIN {print int(n * s)}')") |"; done
  echo "$out"
}
echo "reads (echo): p50 µs / p99 µs / calls/s"
echo
echo "| | 1 connection | 8 connections | 32 connections |"
echo "|---|---|---|---|"
row "direct" "http://127.0.0.1:$SPORT/mcp" echo 1 8 32
row "gateway, allow-all policy" "http://127.0.0.1:${GPORT[allow]}/mcp/stub" echo 1 8 32
row "gateway, shipped policies" "http://127.0.0.1:${GPORT[shipped]}/mcp/stub" echo 1 8 32
if [[ " ${PEERS:-} " == *" contextforge "* ]]; then
  source "$ROOT/benches/peers.sh"
  contextforge "$SPORT"
  HEADER=$PEER_HEADER ARGS='{"text":"hello"}' SCALE=${PEER_SCALE:-0.05} \
    row "ContextForge $CONTEXTFORGE_VERSION (PyPI; SQLite, rate limits off)" "$PEER_URL" "$PEER_TOOL" 1 8 32
  # Stopped before the writes: its background checks would share CPU 0.
  kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true
fi
echo
echo "writes (charge_card, a fresh key per call): p50 µs / p99 µs / calls/s"
echo
echo "| | 1 client | 16 clients | 64 clients |"
echo "|---|---|---|---|"
row "direct" "http://127.0.0.1:$SPORT/mcp" charge_card 1 16 64
row "gateway, allow-all policy" "http://127.0.0.1:${GPORT[allow]}/mcp/stub" charge_card 1 16 64
