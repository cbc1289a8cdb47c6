#!/usr/bin/env bash
# What traces cost the read path. Three gateways (release builds) in front of
# the perf harness's stub, measured in turns with mcp-load's A/B (A: a
# gateway, B: the stub reached directly), every one of them on CPU 0:
#   before  a build without traces (TRACES_BEFORE_BIN, e.g. the commit before them)
#   off     this build, traces off (no [telemetry], no OTEL_* variable)
#   on      this build exporting every span to a local OTLP sink (on CPU 1,
#           as a collector on another host would be)
# Besides latency and throughput, each gateway's CPU time and context
# switches (all threads, /proc/PID/task/*/status) per call of the c=1 runs.
#
#   cargo build --release && ../shared/perf/gateway-ab.sh   # builds the harness once
#   TRACES_BEFORE_BIN=/path/to/old/countersign benches/traces_ab.sh [TURNS]
source "$(dirname "$0")/lib.sh"
TURNS=${1:-3}
BEFORE=${TRACES_BEFORE_BIN:?set TRACES_BEFORE_BIN to a countersign built without traces}
SPORT=$(port); P_BEFORE=$(port); P_OFF=$(port); P_ON=$(port); RPORT=$(port)
stub "$SPORT"
python=$ROOT/.ci/cache/venv/bin/python
[ -x "$python" ] || { echo "needs the peers' Python: .ci/setup-peers" >&2; exit 1; }
taskset -c 1 "$python" "$ROOT/tests/peers/otlp_receiver.py" sink /dev/null 2>"$WORK/sink.log" & PIDS+=($!)
for _ in $(seq 100); do grep -qs 'listening on' "$WORK/sink.log" && break; sleep 0.05; done
RPORT=$(grep -o '[0-9]*$' "$WORK/sink.log")
allow_all "$WORK/policies"
BIN=$BEFORE gateway before "$P_BEFORE" "$WORK/policies" "$SPORT"
gateway off "$P_OFF" "$WORK/policies" "$SPORT"
gateway on "$P_ON" "$WORK/policies" "$SPORT" "" "[telemetry]
endpoint = \"http://127.0.0.1:$RPORT\""
ab() { taskset -c 0 "$PERF/mcp-load" --url "http://127.0.0.1:$1/mcp/stub" --ab "http://127.0.0.1:$SPORT/mcp" \
  --header "Authorization: Bearer $TOKEN" --tool echo --concurrency "$2" --batch "$3" --rounds "$4"; }
for turn in $(seq "$TURNS"); do
  for g in before off on; do
    port_var=P_${g^^}; pid=$(pid_of "$g")
    read -r cpu0 sw0 < <(usage "$pid")
    out=$(ab "${!port_var}" 1 1000 10)
    read -r cpu1 sw1 < <(usage "$pid")
    echo "$out" | jq -r --arg k "$g" --arg t "$turn" \
      --argjson cpu "$(( (cpu1 - cpu0) * 1000000 / TICK ))" --argjson sw "$((sw1 - sw0))" \
      '"\($k) (turn \($t)): c=1 added p50 \(.diff_p50_us_median|floor) us, ratio \(.ratio_p50_median*100|floor/100), CPU \($cpu / 10000 | floor) us/call, \($sw / 10000 * 100 | floor / 100) switches/call, errors \(.errors)"'
  done
  for g in before off on; do
    port_var=P_${g^^}
    ab "${!port_var}" 16 2000 6 | jq -r --arg k "$g" --arg t "$turn" \
      '"\($k) (turn \($t)): c=16 \(.a.throughput_median|floor) calls/s, \((.a.throughput_median/.b.throughput_median*100)|floor)% of direct, errors \(.errors)"'
  done
done
on_pid=$(pid_of on)
curl -s "http://127.0.0.1:$P_ON/healthz" >/dev/null
echo "spans the 'on' gateway handed to the sink: see countersign_trace_spans (its log: $(grep -c 'dropped' "$WORK/on.log" || true) drop warnings)"
