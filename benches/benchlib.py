"""What the Python benches share: a policy folder that allows every call,
a gateway config, and a gateway started on it. Standard library only."""

import hashlib
import os
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKEN = "bench-token"


def mcp_headers(session=None):
    """The headers of a client's POST to /mcp, with `TOKEN`."""
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "Authorization": "Bearer " + TOKEN,
        "MCP-Protocol-Version": "2025-11-25",
    }
    if session:
        headers["Mcp-Session-Id"] = session
    return headers


def allow_all_policies(d):
    """A policy folder under `d` with the project's schema and one permit."""
    pol = os.path.join(d, "policies")
    os.makedirs(pol)
    with open(os.path.join(ROOT, "policies", "schema.cedarschema")) as f:
        schema = f.read()
    with open(os.path.join(pol, "schema.cedarschema"), "w") as f:
        f.write(schema)
    with open(os.path.join(pol, "allow.cedar"), "w") as f:
        f.write('permit (principal, action, resource);\n')
    return pol


def start_gateway(binary, d, servers, cpu=None, env=None):
    """Write a config under `d` (listening on a free port, an allow-all
    policy, `TOKEN` as principal `bench`, then the `servers` TOML), start
    `binary serve` on it (pinned to `cpu` if given) and wait until it
    listens. Returns the process, its address and its log's path."""
    pol = allow_all_policies(d)
    config = os.path.join(d, "countersign.toml")
    with open(config, "w") as f:
        f.write("""
[gateway]
listen = "127.0.0.1:0"
data_dir = "%s"
policies = "%s"

[[identities]]
token_sha256 = "%s"
principal = "bench"
tenant = "bench"

%s
""" % (os.path.join(d, "data"), pol, hashlib.sha256(TOKEN.encode()).hexdigest(), servers))
    log_path = os.path.join(d, "gateway.log")
    cmd = [binary, "serve", "--config", config]
    if cpu is not None:
        cmd = ["taskset", "-c", str(cpu)] + cmd
    with open(log_path, "w") as log:
        gw = subprocess.Popen(cmd, stderr=log, env=env)
    for _ in range(500):
        with open(log_path) as f:
            found = [line for line in f if "listening on" in line]
        if found:
            return gw, found[0].strip().rsplit(" ", 1)[-1], log_path
        time.sleep(0.01)
    gw.terminate()
    raise SystemExit("the gateway did not start")
