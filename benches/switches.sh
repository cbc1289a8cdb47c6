#!/usr/bin/env bash
# Context switches per read at one connection, per thread of the gateway
# (/proc/PID/task/*/status, voluntary and involuntary), over a steady run of N
# reads after a warm-up: no A/B batches, so no idle gaps or warm-up calls in
# the count. The gateway is started unpinned and then pinned to CPU 0 with all
# its threads, as ../shared/perf/gateway-ab.sh does (so it runs as many serving
# threads as the machine has CPUs, on one CPU); STARTED_ON_CPU0=1 starts it on
# CPU 0 instead. Also prints the gateway's CPU per read.
#
#   cargo build --release && ../shared/perf/gateway-ab.sh   # builds the harness once
#   benches/switches.sh [N]      N reads (20000)
N=${1:-20000}
source "$(dirname "$0")/lib.sh"
SPORT=$(port); GP=$(port)
stub "$SPORT"
allow_all "$WORK/policies"
gateway g "$GP" "$WORK/policies" "$SPORT"
if [ -z "${STARTED_ON_CPU0:-}" ]; then
  kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true
  "$BIN" serve --config "$WORK/g.toml" >"$WORK/g.log" 2>&1 & PIDS+=($!)
  for _ in $(seq 200); do grep -qs 'listening on' "$WORK/g.log" && break; sleep 0.05; done
  taskset -a -pc 0 "${PIDS[-1]}" >/dev/null
fi
GW=${PIDS[-1]}
# snap: "THREAD_NAME SWITCHES" summed over the threads of that name, and "cpu TICKS".
snap() {
  for t in /proc/"$GW"/task/*; do
    echo "$(cat "$t/comm") $(awk '/ctxt_switches/ {s += $2} END {print s}' "$t/status")"
  done | awk '{a[$1] += $2} END {for (k in a) print k, a[k]}'
  echo "~cpu $(awk '{print $14 + $15}' "/proc/$GW/stat")"
}
load() { taskset -c 0 "$PERF/mcp-load" --url "http://127.0.0.1:$GP/mcp/stub" --header "Authorization: Bearer $TOKEN" \
  --tool echo --concurrency 1 --requests "$1" --warmup 0; }
load 2000 >/dev/null
snap | sort > "$WORK/s0"
load "$N" | jq -r '"\(.throughput_calls_per_s | floor) reads/s, p50 \(.p50_us | floor) us"'
snap | sort > "$WORK/s1"
join "$WORK/s0" "$WORK/s1" | awk -v n="$N" -v hz="$(getconf CLK_TCK)" '
  $1 == "~cpu" { printf "gateway CPU per read: %d us\n", ($3 - $2) / hz / n * 1e6; next }
  { d = ($3 - $2) / n; total += d; if (d >= 0.005) printf "%s: %.3f switches per read\n", $1, d }
  END { printf "all threads: %.3f switches per read\n", total }'
