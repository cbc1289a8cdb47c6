#!/usr/bin/env bash
# The soak: an hour of mixed traffic at a steady rate, with approvals (a
# third of the writes held, reviewers deciding), a webhook and traces on,
# on one gateway (redb) and on two sharing PostgreSQL, side by side. Every
# minute each gateway's memory, descriptors, threads, runtime tasks, store
# size, audit log size, queued notifications and pending proposals are
# sampled (examples/chaos/sample.rs); then plotted into docs/soak.png and
# summed up (first ten minutes against the last ten).
#
#   cargo build --release --bins --examples
#   benches/soak.sh [MINUTES=60] [RATE=5]        # calls per second, each run
#
# Needs the local PostgreSQL (.ci/setup-postgres) and, for the plot,
# matplotlib (installed here into ~/.cache/countersign-plot when missing).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MINUTES=${1:-60}
RATE=${2:-5}
REL=${SOAK_BIN_DIR:-$ROOT/target/release}
OUT=${SOAK_OUT:-$ROOT/target/soak}
mkdir -p "$OUT"
CALLS=$(python3 -c "print(int($MINUTES * 60 * $RATE))")
run() { # NAME EXTRA...
  local name=$1; shift
  rm -rf "$OUT/$name"
  "$REL/examples/chaos" --calls "$CALLS" --kills 0 --agents 16 --rate "$RATE" --approvals \
    --seed "${SOAK_SEED:-20261204}" --samples "$OUT/$name.csv" --sample-secs 60 \
    --deadline-secs $((MINUTES * 60 + 600)) --json --work "$OUT/$name" \
    --countersign "$REL/countersign" --server "$REL/examples/payments_server" "$@" \
    > "$OUT/$name.json" 2> "$OUT/$name.err"
}
run redb &
A=$!
run postgres --postgres postgres://postgres@127.0.0.1:5432/test &
B=$!
wait $A; wait $B
PY=python3
python3 -c 'import matplotlib' 2>/dev/null || {
  [ -x ~/.cache/countersign-plot/bin/python ] || {
    python3 -m venv ~/.cache/countersign-plot && ~/.cache/countersign-plot/bin/pip install -q matplotlib
  }
  PY=~/.cache/countersign-plot/bin/python
}
"$PY" "$ROOT/benches/soak_plot.py" "$OUT/redb.csv" "$OUT/postgres.csv" "$ROOT/docs/soak.png"
for name in redb postgres; do
  python3 -c "import json,sys; s=json.load(open(sys.argv[1])); a=s.get('approvals') or {}; print(sys.argv[2], 'ok' if s['ok'] else 'BROKEN', s['calls'], 'calls', s['executions'], 'executions', a.get('proposals'), 'proposals')" "$OUT/$name.json" "$name"
done
