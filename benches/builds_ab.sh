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
pid_of() { pgrep -f -- "--config $WORK/$1.toml" | head -1; }
usage() {
  local cpu sw
  cpu=$(awk '{print $14 + $15}' "/proc/$1/stat")
  sw=$(cat /proc/"$1"/task/*/status | awk '/ctxt_switches/ {s += $2} END {print s}')
  echo "$cpu $sw"
}
TICK=$(getconf CLK_TCK)
EXTRA=()
[ "$TOOL" = echo ] || EXTRA=(--unique-keys)
ab() { taskset -c 0 "$PERF/mcp-load" --url "http://127.0.0.1:$1/mcp/stub" --ab "http://127.0.0.1:$SPORT/mcp" \
  --header "Authorization: Bearer $TOKEN" --tool "$TOOL" "${EXTRA[@]}" --concurrency "$2" --batch "$3" --rounds "$4"; }
for turn in $(seq "$TURNS"); do
  for g in a b; do
    port_var=P_${g^^}; pid=$(pid_of "$g")
    read -r cpu0 sw0 < <(usage "$pid")
    out=$(ab "${!port_var}" 1 1000 10)
    read -r cpu1 sw1 < <(usage "$pid")
    echo "$out" | jq -r --arg k "$g" --arg t "$turn" \
      --argjson cpu "$(( (cpu1 - cpu0) * 1000000 / TICK ))" --argjson sw "$((sw1 - sw0))" \
      '"\($k) (turn \($t)): c=1 added p50 \(.diff_p50_us_median|floor) us, ratio \(.ratio_p50_median*100|floor/100), CPU \($cpu / 10000 | floor) us/call, \($sw / 10000 * 100 | floor / 100) switches/call, errors \(.errors)"'
  done
  for g in a b; do
    port_var=P_${g^^}; pid=$(pid_of "$g")
    read -r cpu0 sw0 < <(usage "$pid")
    out=$(ab "${!port_var}" 16 2000 6)
    read -r cpu1 sw1 < <(usage "$pid")
    echo "$out" | jq -r --arg k "$g" --arg t "$turn" \
      --argjson cpu "$(( (cpu1 - cpu0) * 1000000 / TICK ))" --argjson sw "$((sw1 - sw0))" \
      '"\($k) (turn \($t)): c=16 \(.a.throughput_median|floor) calls/s, \((.a.throughput_median/.b.throughput_median*100)|floor)% of direct, CPU \($cpu / 12000 | floor) us/call, \($sw / 12000 * 100 | floor / 100) switches/call, errors \(.errors)"'
  done
done
