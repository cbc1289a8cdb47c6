#!/usr/bin/env python3
"""Memory per idle HTTP client session.

Starts a gateway (release build) in front of the harness's mcp-stub over
HTTP, opens SESSIONS client sessions (initialize, then
notifications/initialized, as a client does), and reads the gateway's
resident memory (VmRSS, /proc) before and after. Then it shows every session
is still held: a `ping` on each must answer 200. Prints the memory per
session in KiB.

    cargo build --release && ../shared/perf/gateway-ab.sh   # builds mcp-stub once
    python3 benches/session_memory.py [--sessions 1000]

Standard library only.
"""

import argparse
import http.client
import json
import os
import subprocess
import tempfile
import time

from benchlib import ROOT, mcp_headers, start_gateway

PERF = os.path.join(os.environ.get("PERF_TARGET_DIR", os.path.expanduser("~/.cache/countersign-perf-target")), "release")


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Conn:
    """One keep-alive HTTP connection for all the requests."""

    def __init__(self, port):
        self.c = http.client.HTTPConnection("127.0.0.1", port)

    def post(self, path, body, session=None):
        headers = mcp_headers(session)
        self.c.request("POST", path, json.dumps(body), headers)
        r = self.c.getresponse()
        data = r.read()
        return r.status, r.getheader("Mcp-Session-Id"), data


def open_session(conn, path, n):
    status, sid, data = conn.post(path, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "session-memory-bench", "version": "1"}}})
    if status != 200 or not sid:
        raise SystemExit("session %d: initialize answered %d: %s" % (n, status, data[:200]))
    status, _, _ = conn.post(path, {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
    if status not in (200, 202):
        raise SystemExit("session %d: notifications/initialized answered %d" % (n, status))
    return sid


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise SystemExit("no VmRSS for %d" % pid)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/countersign"))
    ap.add_argument("--sessions", type=int, default=1000)
    a = ap.parse_args()
    stub_port = free_port()
    with tempfile.TemporaryDirectory() as d:
        stub = subprocess.Popen([os.path.join(PERF, "mcp-stub"), "--port", str(stub_port), "--quiet"],
                                stdout=subprocess.DEVNULL)
        gw = None
        try:
            gw, addr, _ = start_gateway(a.bin, d, '[servers.stub]\nurl = "http://127.0.0.1:%d/mcp"\n' % stub_port)
            gw_port = int(addr.rsplit(":", 1)[1])
            conn = Conn(gw_port)
            path = "/mcp/stub"
            # One session first, so what every gateway allocates once (the
            # tool catalog, the first upstream connection) is not counted.
            warm = open_session(conn, path, -1)
            conn.post(path, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, warm)
            before = rss_kib(gw.pid)
            sessions = [open_session(conn, path, n) for n in range(a.sessions)]
            time.sleep(0.2)
            after = rss_kib(gw.pid)
            held = 0
            for n, sid in enumerate(sessions):
                status, _, data = conn.post(path, {"jsonrpc": "2.0", "id": n + 2, "method": "ping"}, sid)
                if status == 200 and b'"result"' in data:
                    held += 1
            print("%d sessions: RSS %d KiB before, %d KiB after: %.1f KiB per idle session; %d of %d still held"
                  % (a.sessions, before, after, (after - before) / a.sessions, held, a.sessions))
            if held != a.sessions:
                raise SystemExit("not every session was held")
        finally:
            if gw:
                gw.terminate()
                gw.wait()
            stub.terminate()
            stub.wait()


if __name__ == "__main__":
    main()
