# Sourced by the shell benches: the release binary and the perf harness, a work
# folder removed on exit with every process started here, free ports, an
# allow-all policy folder, and a gateway in front of the harness's stub.
#   BIN     the countersign binary (COUNTERSIGN_BIN, or target/release/countersign)
#   PERF    the harness's release folder (mcp-stub, mcp-load)
#   WORK    a temporary folder; PIDS: processes to stop on exit
#   TOKEN   the bearer token every gateway here accepts (principal agent-1, tenant perf)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${COUNTERSIGN_BIN:-$ROOT/target/release/countersign}
PERF=${PERF_TARGET_DIR:-$HOME/.cache/countersign-perf-target}/release
[ -x "$BIN" ] && [ -x "$PERF/mcp-stub" ] && [ -x "$PERF/mcp-load" ] || {
  echo "needs $BIN and the harness: cargo build --release && ../shared/perf/gateway-ab.sh" >&2
  exit 1
}
WORK=$(mktemp -d)
PIDS=()
# BENCH_LOGS=DIR keeps the gateways' logs there.
bench_cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  # Gone before their folder is: a gateway's audit writer still appends at exit.
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ -n "${BENCH_LOGS:-}" ]; then mkdir -p "$BENCH_LOGS" && cp "$WORK"/*.log "$BENCH_LOGS"/ 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap bench_cleanup EXIT
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
TOKEN=perf-token-1
SHA=$(printf %s "$TOKEN" | sha256sum | cut -d' ' -f1)

# stub PORT: the harness's stub on CPU 0.
stub() { taskset -c 0 "$PERF/mcp-stub" --port "$1" --quiet >/dev/null & PIDS+=($!); }

# allow_all DIR: a policy folder with the project's schema and one permit.
allow_all() {
  mkdir -p "$1"
  cp "$ROOT/policies/schema.cedarschema" "$1/"
  printf '@id("allow-all")\npermit (principal, action, resource);\n' > "$1/all.cedar"
}

# gateway NAME PORT POLICIES STUB_PORT [GATEWAY_LINES] [MORE_TOML]: write $WORK/NAME.toml, start the
# gateway on CPU 0 with its log in $WORK/NAME.log, and wait until it listens.
gateway() {
  cat > "$WORK/$1.toml" <<T
[gateway]
listen = "127.0.0.1:$2"
data_dir = "$WORK/data-$1"
policies = "$3"
${5:-}

[servers.stub]
url = "http://127.0.0.1:$4/mcp"

[[identities]]
token_sha256 = "$SHA"
principal = "agent-1"
tenant = "perf"
groups = ["agents"]
${6:-}
T
  taskset -c 0 "$BIN" serve --config "$WORK/$1.toml" >"$WORK/$1.log" 2>&1 & PIDS+=($!)
  for _ in $(seq 200); do grep -qs 'listening on' "$WORK/$1.log" && return; sleep 0.05; done
  echo "gateway $1 did not start:" >&2; cat "$WORK/$1.log" >&2; exit 1
}

# pid_of NAME: the pid of the gateway started as NAME.
pid_of() { pgrep -f -- "--config $WORK/$1.toml" | head -1; }

# usage PID: "CPU_TICKS SWITCHES" of every thread of PID (/proc/PID/stat, /proc/PID/task/*/status).
usage() {
  local cpu sw
  cpu=$(awk '{print $14 + $15}' "/proc/$1/stat")
  sw=$(cat /proc/"$1"/task/*/status | awk '/ctxt_switches/ {s += $2} END {print s}')
  echo "$cpu $sw"
}
TICK=$(getconf CLK_TCK)
