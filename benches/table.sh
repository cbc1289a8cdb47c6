#!/usr/bin/env bash
# The comparison table of docs/performance.md, from one run: p50, p99 and calls/s
#   reads (echo) at 1, 8 and 32 connections: the stub direct; through a gateway with an allow-all policy;
#     through a gateway with the shipped policies (policies/, read-only tools run unattended);
#   writes (charge_card, a fresh explicit key per call: reserved, durably dispatched, completed) at 1, 16
#     and 64 clients: the stub direct; through the allow-all gateway (under the shipped policies a write
#     waits for a reviewer, so it has no unattended row).
# Every gateway keeps its audit log (it cannot be turned off). Every process on CPU 0, as in the harness.
#
#   cargo build --release && ../shared/perf/gateway-ab.sh   # builds mcp-stub and mcp-load once
#   benches/table.sh [SCALE]      SCALE multiplies the calls per cell (default 1: 2,000 to 16,000)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${COUNTERSIGN_BIN:-$ROOT/target/release/countersign}
PERF=${PERF_TARGET_DIR:-$HOME/.cache/countersign-perf-target}/release
SCALE=${1:-1}
[ -x "$BIN" ] && [ -x "$PERF/mcp-stub" ] && [ -x "$PERF/mcp-load" ] || { echo "see the header" >&2; exit 1; }
WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
SPORT=$(port)
taskset -c 0 "$PERF/mcp-stub" --port "$SPORT" --quiet >/dev/null & PIDS+=($!)
TOKEN=perf-token-1
SHA=$(printf %s "$TOKEN" | sha256sum | cut -d' ' -f1)
declare -A GPORT
for g in allow shipped; do
  GPORT[$g]=$(port)
  mkdir -p "$WORK/$g"
  if [ "$g" = allow ]; then
    mkdir -p "$WORK/$g/policies"
    cp "$ROOT/policies/schema.cedarschema" "$WORK/$g/policies/"
    printf '@id("allow-all")\npermit (principal, action, resource);\n' > "$WORK/$g/policies/all.cedar"
  else
    cp -r "$ROOT/policies" "$WORK/$g/policies"
  fi
  cat > "$WORK/$g/countersign.toml" <<T
[gateway]
listen = "127.0.0.1:${GPORT[$g]}"
data_dir = "$WORK/$g/data"
policies = "$WORK/$g/policies"

[servers.stub]
url = "http://127.0.0.1:$SPORT/mcp"

[[identities]]
token_sha256 = "$SHA"
principal = "agent-1"
tenant = "perf"
groups = ["agents"]
T
  taskset -c 0 "$BIN" serve --config "$WORK/$g/countersign.toml" >"$WORK/$g/gateway.log" 2>&1 & PIDS+=($!)
  for _ in $(seq 100); do grep -qs 'listening on' "$WORK/$g/gateway.log" && break; sleep 0.1; done
done
# cell URL TOOL C N: "p50 µs / p99 µs / calls/s"
cell() {
  local extra=()
  [ "$2" = echo ] || extra=(--unique-keys)
  taskset -c 0 "$PERF/mcp-load" --url "$1" --header "Authorization: Bearer $TOKEN" --tool "$2" "${extra[@]}" \
    --concurrency "$3" --requests "$4" --warmup 200 \
    | jq -r 'if .errors > 0 then "errors \(.errors)" else "\(.p50_us|floor) / \(.p99_us|floor) / \(.throughput_calls_per_s|floor)" end'
}
row() { # LABEL URL TOOL C1 C2 C3
  local label=$1 url=$2 tool=$3; shift 3
  local out="| $label |"
  for c in "$@"; do out="$out $(cell "$url" "$tool" "$c" $(( (c < 8 ? 2000 : c * 500) * SCALE ))) |"; done
  echo "$out"
}
echo "reads (echo): p50 µs / p99 µs / calls/s"
echo
echo "| | 1 connection | 8 connections | 32 connections |"
echo "|---|---|---|---|"
row "direct" "http://127.0.0.1:$SPORT/mcp" echo 1 8 32
row "gateway, allow-all policy" "http://127.0.0.1:${GPORT[allow]}/mcp/stub" echo 1 8 32
row "gateway, shipped policies" "http://127.0.0.1:${GPORT[shipped]}/mcp/stub" echo 1 8 32
echo
echo "writes (charge_card, a fresh key per call): p50 µs / p99 µs / calls/s"
echo
echo "| | 1 client | 16 clients | 64 clients |"
echo "|---|---|---|---|"
row "direct" "http://127.0.0.1:$SPORT/mcp" charge_card 1 16 64
row "gateway, allow-all policy" "http://127.0.0.1:${GPORT[allow]}/mcp/stub" charge_card 1 16 64
