#!/usr/bin/env bash
# Two builds of the gateway on the read (or write) path, in turns: A (BEFORE_BIN,
# e.g. an older commit) and B (this build), each in front of the perf
# harness's stub, measured with mcp-load's A/B against the stub reached
# directly. Like ../shared/perf/gateway-ab.sh, every gateway is started
# unpinned and then pinned to CPU 0 with all its threads, so it runs as many
# serving threads (or tokio workers) as the machine has CPUs, on one CPU;
# STARTED_ON_CPU0=1 starts them on CPU 0 instead (one thread). Besides the
# harness's figures, each gateway's CPU time and context switches (all
# threads, /proc/PID/task/*/status) per call of the c=1 runs.
#
#   cargo build --release && ../shared/perf/gateway-ab.sh   # builds the harness once
#   BEFORE_BIN=/path/to/old/countersign benches/builds_ab.sh [TURNS] [TOOL]   # TOOL: echo | charge_card
source "$(dirname "$0")/lib.sh"
TURNS=${1:-3}; TOOL=${2:-echo}
BEFORE=${BEFORE_BIN:?set BEFORE_BIN to the countersign to compare with}
SPORT=$(port); P_A=$(port); P_B=$(port)
stub "$SPORT"
allow_all "$WORK/policies"
start() { # NAME PORT BIN
  if [ -n "${STARTED_ON_CPU0:-}" ]; then
    BIN=$3 gateway "$1" "$2" "$WORK/policies" "$SPORT"
  else
    # lib.sh's gateway starts on CPU 0: start this one on every CPU, then pin it.
    BIN=$3 gateway "$1" "$2" "$WORK/policies" "$SPORT" >/dev/null
    kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true
    "$3" serve --config "$WORK/$1.toml" >"$WORK/$1.log" 2>&1 & PIDS+=($!)
    for _ in $(seq 200); do grep -qs 'listening on' "$WORK/$1.log" && break; sleep 0.05; done
    taskset -a -pc 0 "${PIDS[-1]}" >/dev/null
  fi
}
start a "$P_A" "$BEFORE"
start b "$P_B" "$BIN"
EXTRA=()
[ "$TOOL" = echo ] || EXTRA=(--unique-keys)
ab() { taskset -c 0 "$PERF/mcp-load" --url "http://127.0.0.1:$1/mcp/stub" --ab "http://127.0.0.1:$SPORT/mcp" \
  --header "Authorization: Bearer $TOKEN" --tool "$TOOL" "${EXTRA[@]}" --concurrency "$2" --batch "$3" --rounds "$4"; }
# measure GATEWAY C BATCH ROUNDS TURN: one A/B run of that gateway, with its CPU and switches per call.
measure() {
  local port_var=P_${1^^} pid cpu0 sw0 cpu1 sw1 out calls=$(($3 * $4))
  pid=$(pid_of "$1")
  read -r cpu0 sw0 < <(usage "$pid")
  out=$(ab "${!port_var}" "$2" "$3" "$4")
  read -r cpu1 sw1 < <(usage "$pid")
  echo "$out" | jq -r --arg k "$1" --arg t "$5" --arg c "$2" --argjson n "$calls" \
    --argjson cpu "$(( (cpu1 - cpu0) * 1000000 / TICK ))" --argjson sw "$((sw1 - sw0))" \
    '"\($k) (turn \($t)): c=\($c) added p50 \(.diff_p50_us_median|floor) us, \(.a.throughput_median|floor) calls/s, \((.a.throughput_median/.b.throughput_median*100)|floor)% of direct, CPU \($cpu / $n | floor) us/call, \($sw / $n * 100 | floor / 100) switches/call, errors \(.errors)"'
}
for turn in $(seq "$TURNS"); do
  for g in a b; do measure "$g" 1 1000 10 "$turn"; done
  for g in a b; do measure "$g" 16 2000 6 "$turn"; done
done
