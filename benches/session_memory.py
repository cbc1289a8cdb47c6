#!/usr/bin/env python3
"""Memory per idle HTTP client session, and a soak of them.

Starts a gateway (release build) in front of the harness's mcp-stub over
HTTP, opens SESSIONS client sessions (initialize, then
notifications/initialized, as a client does), and reads the gateway's
resident memory (VmRSS, /proc) before and after. Then the soak: ROUNDS
times, a `ping` on every session (each must answer 200), with the memory
read after each round; it must not grow. Last, every session is closed
(DELETE), and the gateway's open file descriptors (/proc/PID/fd) must be
back where they were before the sessions. Prints the memory per session in
KiB, the memory after each round, and the descriptors.

    cargo build --release && ../shared/perf/gateway-ab.sh   # builds mcp-stub once
    python3 benches/session_memory.py [--sessions 1000] [--rounds 5] [--stdio]

With --stdio the upstream is the stub as a stdio child, one per session (as
the gateway runs stdio servers), so each session holds pipes: the
descriptors then show they are released.

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


def fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


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
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--stdio", action="store_true",
                    help="the stub as a stdio upstream: one child process per session, so descriptors are held")
    a = ap.parse_args()
    stub_port = free_port()
    with tempfile.TemporaryDirectory() as d:
        stub = subprocess.Popen([os.path.join(PERF, "mcp-stub"), "--port", str(stub_port), "--quiet"],
                                stdout=subprocess.DEVNULL)
        gw = None
        try:
            # The per-identity session cap (default 256) is raised: every
            # session here is the one bench identity's.
            gw, addr, _ = start_gateway(
                a.bin, d,
                '[limits]\nmax_sessions_per_identity = %d\n\n' % (a.sessions + 10)
                + ('[servers.stub]\ncommand = "%s"\nargs = ["--stdio"]\n' % os.path.join(PERF, "mcp-stub")
                   if a.stdio else '[servers.stub]\nurl = "http://127.0.0.1:%d/mcp"\n' % stub_port))
            gw_port = int(addr.rsplit(":", 1)[1])
            conn = Conn(gw_port)
            path = "/mcp/stub"
            # One session first, so what every gateway allocates once (the
            # tool catalog, the first upstream connection) is not counted.
            warm = open_session(conn, path, -1)
            conn.post(path, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, warm)
            before = rss_kib(gw.pid)
            fds_before = fds(gw.pid)
            sessions = [open_session(conn, path, n) for n in range(a.sessions)]
            time.sleep(0.2)
            after = rss_kib(gw.pid)
            print("%d sessions: RSS %d KiB before, %d KiB after: %.1f KiB per idle session"
                  % (a.sessions, before, after, (after - before) / a.sessions))
            rounds = []
            for r in range(a.rounds):
                held = 0
                for n, sid in enumerate(sessions):
                    status, _, data = conn.post(path, {"jsonrpc": "2.0", "id": n + 2, "method": "ping"}, sid)
                    if status == 200 and b'"result"' in data:
                        held += 1
                if held != a.sessions:
                    raise SystemExit("round %d: %d of %d sessions still held" % (r + 1, held, a.sessions))
                rounds.append(rss_kib(gw.pid))
            print("soak: %d rounds of a ping on every session, all held; RSS after each: %s KiB"
                  % (a.rounds, ", ".join(str(x) for x in rounds)))
            # The sessions are held, not leaked: a few pages of allocator
            # slack between rounds, no growth with the number of rounds.
            if rounds and rounds[-1] > rounds[0] * 1.05 + 1024:
                raise SystemExit("memory grew during the soak: %s" % rounds)
            fds_held = fds(gw.pid)
            for sid in sessions:
                conn.c.request("DELETE", path, headers=mcp_headers(sid))
                resp = conn.c.getresponse()
                resp.read()
                if resp.status not in (200, 202, 204):
                    raise SystemExit("DELETE answered %d" % resp.status)
            deadline = time.time() + 10
            while fds(gw.pid) > fds_before + 2 and time.time() < deadline:
                time.sleep(0.05)
            fds_after = fds(gw.pid)
            print("file descriptors: %d before the sessions, %d while held, %d after closing them"
                  % (fds_before, fds_held, fds_after))
            if fds_after > fds_before + 2:
                raise SystemExit("descriptors were not released when the sessions closed")
        finally:
            if gw:
                gw.terminate()
                gw.wait()
            stub.terminate()
            stub.wait()


if __name__ == "__main__":
    main()
