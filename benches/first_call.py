#!/usr/bin/env python3
"""What the gateway's own tool list adds to a session's first call.

Starts a fresh gateway (release build) in front of the example payments server
over stdio, RUNS times, everything pinned to one CPU. In each run it opens two
sessions one after the other and times three `get_balance` calls in each: the
first call of the first session waits for the gateway's own `tools/list`
(and the first-use pins' one durable commit); the first call of the second
session lists its own new child's tools again; the later calls list nothing.

    cargo build --release --examples
    python3 benches/first_call.py [--bin target/release/countersign] [--runs 15] [--cpu 0]

Prints the median of each call position over the runs, in microseconds.
Standard library only.
"""

import argparse
import json
import os
import statistics
import tempfile
import time
import urllib.request

from benchlib import ROOT, mcp_headers, start_gateway


def post(url, body, session=None):
    headers = mcp_headers(session)
    req = urllib.request.Request(url, json.dumps(body).encode(), headers)
    with urllib.request.urlopen(req) as resp:
        return resp.headers.get("Mcp-Session-Id"), resp.read()


def session(url):
    sid, _ = post(url, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "first-call-bench", "version": "1"}}})
    post(url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
    times = []
    for n in range(3):
        body = {"jsonrpc": "2.0", "id": n + 1, "method": "tools/call",
                "params": {"name": "get_balance", "arguments": {"account": "a%d" % n}}}
        start = time.perf_counter()
        _, answer = post(url, body, sid)
        times.append((time.perf_counter() - start) * 1e6)
        if b'"isError":true' in answer.replace(b" ", b""):
            raise SystemExit("the call was refused: %s" % answer[:300])
    return times


def run_once(binary, example, cpu):
    with tempfile.TemporaryDirectory() as d:
        # Debug for the pipeline only: the log says each time the gateway
        # fetched a tool list, which the report counts.
        env = dict(os.environ, COUNTERSIGN_LOG="warn,countersign::enforce=debug")
        gw, addr, log_path = start_gateway(
            binary, d, '[servers.payments]\ncommand = "%s"\n' % example, cpu=cpu, env=env)
        try:
            url = "http://%s/mcp/payments" % addr
            times = session(url) + session(url)
        finally:
            gw.terminate()
            gw.wait()
        with open(log_path) as f:
            fetches = sum(1 for line in f if "tool list fetched" in line)
        return times, fetches


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/countersign"))
    ap.add_argument("--example", default=os.path.join(ROOT, "target/release/examples/payments_server"))
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--cpu", type=int, default=0)
    a = ap.parse_args()
    os.sched_setaffinity(0, {a.cpu})
    results = [run_once(a.bin, a.example, a.cpu) for _ in range(a.runs)]
    runs = [r[0] for r in results]
    print("tool lists fetched by the gateway per run: %s" % sorted({r[1] for r in results}))
    names = ["session 1, call 1", "session 1, call 2", "session 1, call 3",
             "session 2, call 1", "session 2, call 2", "session 2, call 3"]
    for i, name in enumerate(names):
        print("%-18s p50 %7.0f µs" % (name, statistics.median(r[i] for r in runs)))


if __name__ == "__main__":
    main()
