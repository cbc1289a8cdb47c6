#!/usr/bin/env bash
# What configured webhooks cost the read path: two gateways (release build)
# in front of the perf harness's stub, one without [notify] and one with a
# webhook. Before the runs, 200 held writes give the hooked gateway 200
# events, and the receiver (a local Python server) answers every one 500,
# so the delivery worker keeps claiming, sending and rescheduling them
# (about 200 requests a second) through the whole measurement. mcp-load runs
# its A/B (A: a gateway, B: the stub reached directly) against each, in
# turns. Every process is on CPU 0.
#
#   cargo build --release && ../shared/perf/gateway-ab.sh   # builds the harness once
#   benches/notify_ab.sh
source "$(dirname "$0")/lib.sh"
SPORT=$(port); PLAIN=$(port); HOOKED=$(port); RPORT=$(port)
stub "$SPORT"
# The receiver: every request answered 500, and counted.
cat > "$WORK/receiver.py" <<'PY'
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        with open(sys.argv[2], "a") as f:
            f.write("x")
        self.send_response(500); self.end_headers()
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
# 200 distinct held writes (each its own proposal and event).
cat > "$WORK/propose.py" <<'PY'
import json, sys, urllib.request
url, token = sys.argv[1], sys.argv[2]
def post(body, session=None):
    h = {"content-type": "application/json", "accept": "application/json, text/event-stream",
         "authorization": "Bearer " + token}
    if session:
        h["mcp-session-id"] = session
    r = urllib.request.urlopen(urllib.request.Request(url, json.dumps(body).encode(), h))
    r.read()
    return r.headers.get("mcp-session-id")
s = post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
          "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}})
post({"jsonrpc": "2.0", "method": "notifications/initialized"}, s)
for i in range(200):
    post({"jsonrpc": "2.0", "id": i + 1, "method": "tools/call",
          "params": {"name": "charge_card", "arguments": {"amount": i + 1}}}, s)
PY
taskset -c 0 python3 "$WORK/receiver.py" "$RPORT" "$WORK/received" & PIDS+=($!)
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

[notify]
max_backoff = \"1s\"

[[notify.webhooks]]
name = \"bench\"
url = \"http://127.0.0.1:$RPORT/hook\"
secret = { env = \"COUNTERSIGN_WEBHOOK_SECRET\" }"
taskset -c 0 python3 "$WORK/propose.py" "http://127.0.0.1:$HOOKED/mcp/stub" "$TOKEN"
before=$(wc -c < "$WORK/received" 2>/dev/null || echo 0)
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
after=$(wc -c < "$WORK/received")
echo "webhook requests the hooked gateway's worker sent during the runs: $((after - before))"
