#!/usr/bin/env bash
# What configured webhooks cost the read path: two gateways (release build)
# in front of the perf harness's stub, one without [notify] and one with a
# webhook whose receiver (a local Python server) answers slowly, while a
# third client keeps making proposals so that the delivery worker has work.
# mcp-load runs its A/B (A: a gateway, B: the stub reached directly) against
# each, in turns. Every process is on CPU 0.
#
#   cargo build --release && ../shared/perf/gateway-ab.sh   # builds the harness once
#   benches/notify_ab.sh
source "$(dirname "$0")/lib.sh"
SPORT=$(port); PLAIN=$(port); HOOKED=$(port); RPORT=$(port)
stub "$SPORT"
# The receiver: every request answered after 200 ms.
cat > "$WORK/receiver.py" <<'PY'
import http.server, sys, time
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        time.sleep(0.2)
        self.send_response(200); self.end_headers()
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
taskset -c 0 python3 "$WORK/receiver.py" "$RPORT" & PIDS+=($!)
allow_all "$WORK/policies"
# Writes to the stub need a reviewer: every write makes a proposal (and an event).
printf '@id("reads")\npermit (principal, action == Action::"call", resource) when { resource.readOnly };\n@id("writes")\npermit (principal, action == Action::"call", resource) when { context.approved };\n' \
  > "$WORK/policies/all.cedar"
export COUNTERSIGN_WEBHOOK_SECRET=bench-secret
gateway plain "$PLAIN" "$WORK/policies" "$SPORT" "" "[approvals]
hold = \"0s\"
max_pending = 100000"
gateway hooked "$HOOKED" "$WORK/policies" "$SPORT" "" "[approvals]
hold = \"0s\"
max_pending = 100000

[[notify.webhooks]]
name = \"bench\"
url = \"http://127.0.0.1:$RPORT/hook\"
secret = { env = \"COUNTERSIGN_WEBHOOK_SECRET\" }"
# Proposals keep coming on the hooked gateway: unique writes, each held.
( while true; do
    taskset -c 0 "$PERF/mcp-load" --url "http://127.0.0.1:$HOOKED/mcp/stub" --header "Authorization: Bearer $TOKEN" \
      --tool charge_card --unique-keys --concurrency 1 --batch 50 --rounds 1 >/dev/null 2>&1 || true
    sleep 0.5
  done ) & PIDS+=($!)
ab() { taskset -c 0 "$PERF/mcp-load" --url "http://127.0.0.1:$1/mcp/stub" --ab "http://127.0.0.1:$SPORT/mcp" \
  --header "Authorization: Bearer $TOKEN" --tool echo --concurrency "$2" --batch "$3" --rounds "$4"; }
report() { jq -r --arg k "$1" '"\($k): c=1 added p50 \(.diff_p50_us_median|floor) us, ratio \(.ratio_p50_median*100|floor/100), errors \(.errors)"'; }
share() { jq -r --arg k "$1" '"\($k): c=16 \(.a.throughput_median|floor) calls/s, \((.a.throughput_median/.b.throughput_median*100)|floor)% of direct, errors \(.errors)"'; }
for turn in 1 2; do
  ab "$PLAIN" 1 1000 10 | report "no webhook   (turn $turn)"
  ab "$HOOKED" 1 1000 10 | report "with webhook (turn $turn)"
  ab "$PLAIN" 16 2000 6 | share "no webhook   (turn $turn)"
  ab "$HOOKED" 16 2000 6 | share "with webhook (turn $turn)"
done
delivered=$(grep -c 'notification delivered' "$WORK/hooked.log" || true)
echo "events delivered by the hooked gateway during the run: $delivered"
