#!/usr/bin/env bash
# What TLS on the gateway's listener adds to a read: two gateways (release
# build) in front of the same upstream (the perf harness's mcp-stub), one plain
# and one with gateway.tls_cert, called alternately in batches over one
# keep-alive connection each by the same client (curl), every process on
# CPU 0. Prints the median time per call of each and the difference.
#
#   cargo build --release && ../shared/perf/gateway-ab.sh   # builds mcp-stub once
#   benches/tls_ab.sh [CALLS_PER_BATCH] [BATCHES]
#
# curl's own time per call is in both medians; the difference is what TLS
# adds (record encryption on a warm connection; the handshake is paid once).
PER=${1:-200}
BATCHES=${2:-10}
source "$(dirname "$0")/lib.sh"
SPORT=$(port)
stub "$SPORT"
# A self-signed certificate for 127.0.0.1 (the client pins it as its CA).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=bench \
  -addext subjectAltName=IP:127.0.0.1 -keyout "$WORK/key.pem" -out "$WORK/cert.pem" 2>/dev/null
allow_all "$WORK/policies"
PPORT=$(port); TPORT=$(port)
gateway plain "$PPORT" "$WORK/policies" "$SPORT"
gateway tls "$TPORT" "$WORK/policies" "$SPORT" "tls_cert = \"$WORK/cert.pem\"
tls_key = \"$WORK/key.pem\""
CURL=(taskset -c 0 curl -s --cacert "$WORK/cert.pem" -H "Authorization: Bearer $TOKEN"
  -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream')
session() { # BASE -> session id
  "${CURL[@]}" -D - -o /dev/null "$1/mcp/stub" \
    -d '{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"tls-ab","version":"1"}}}' \
    | awk -F': ' 'tolower($1)=="mcp-session-id"{print $2}' | tr -d '\r'
}
batch() { # BASE SESSION -> one time_total (s) per call, over one connection
  local urls=()
  for _ in $(seq "$PER"); do urls+=(-o /dev/null "$1/mcp/stub"); done
  "${CURL[@]}" -H "Mcp-Session-Id: $2" -H 'MCP-Protocol-Version: 2025-11-25' \
    -d '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}' \
    -w '%{time_total}\n' "${urls[@]}"
}
P=http://127.0.0.1:$PPORT; T=https://127.0.0.1:$TPORT
PS=$(session "$P"); TS=$(session "$T")
: > "$WORK/plain.txt"; : > "$WORK/tls.txt"
for _ in $(seq "$BATCHES"); do
  batch "$P" "$PS" | tail -n +2 >> "$WORK/plain.txt"
  batch "$T" "$TS" | tail -n +2 >> "$WORK/tls.txt"
done
python3 - "$WORK/plain.txt" "$WORK/tls.txt" <<'PY'
import statistics, sys
med = [statistics.median(float(l) for l in open(p) if l.strip()) * 1e6 for p in sys.argv[1:3]]
print(f"plain p50 {med[0]:.0f} us per call, tls p50 {med[1]:.0f} us per call: TLS adds {med[1]-med[0]:+.0f} us ({med[1]/med[0]:.2f}x)")
PY
