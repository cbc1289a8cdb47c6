# Sourced by benches/table.sh when PEERS names other gateways: each is
# installed from its own published release into .ci/cache/peers (outside git),
# started on CPU 0 in front of the same stub as countersign, and put in the
# table with the same load. Functions set PEER_URL, PEER_HEADER and PEER_TOOL
# (the name the peer gives the stub's echo tool).
PEER_CACHE=$ROOT/.ci/cache/peers
mkdir -p "$PEER_CACHE"

# contextforge STUB_PORT: IBM's ContextForge MCP gateway (PyPI
# mcp-contextforge-gateway), SQLite and an in-memory cache, its defaults
# otherwise, except that its request rate limits are raised out of the way (at
# their defaults the load locks the account out after a few seconds).
CONTEXTFORGE_VERSION=1.0.7.post20260921
contextforge() {
  local venv=$PEER_CACHE/contextforge-$CONTEXTFORGE_VERSION port
  if [ ! -x "$venv/bin/mcpgateway" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q "mcp-contextforge-gateway==$CONTEXTFORGE_VERSION"
  fi
  port=$(port)
  local secret=bench-secret-key-0123456789abcdef0123456789
  # Its settings, read by the server and by its token tool alike.
  export DATABASE_URL=sqlite:///$WORK/contextforge.db JWT_SECRET_KEY=$secret \
      PLATFORM_ADMIN_EMAIL=admin@example.com PLATFORM_ADMIN_PASSWORD=Bench-Passw0rd-123 \
      BASIC_AUTH_PASSWORD=Bench-Passw0rd-123 SSRF_ALLOW_LOCALHOST=true SSRF_ALLOW_PRIVATE_NETWORKS=true \
      CACHE_TYPE=memory MCPGATEWAY_UI_ENABLED=false MCPGATEWAY_ADMIN_API_ENABLED=true LOG_LEVEL=ERROR \
      RATE_LIMITING_ENABLED=false RATE_LIMIT_LOCKOUT_ENABLED=false TOOL_RATE_LIMIT=100000000
  (
    cd "$WORK"
    exec taskset -c 0 "$venv/bin/mcpgateway" --host 127.0.0.1 --port "$port"
  ) >"$WORK/contextforge.log" 2>&1 & PIDS+=($!)
  for _ in $(seq 120); do curl -sf -o /dev/null "http://127.0.0.1:$port/health" && break; sleep 0.5; done
  local token api=http://127.0.0.1:$port
  token=$("$venv/bin/python" -m mcpgateway.utils.create_jwt_token --username admin@example.com --exp 600 \
    --secret "$secret" 2>/dev/null | tail -1)
  curl -sf -X POST "$api/gateways" -H "Authorization: Bearer $token" -H 'content-type: application/json' \
    -d "{\"name\":\"stub\",\"url\":\"http://127.0.0.1:$1/mcp\",\"transport\":\"STREAMABLEHTTP\"}" >/dev/null
  local tools server
  tools=$(curl -sf "$api/tools" -H "Authorization: Bearer $token" | jq -c '[(if type == "array" then . else .items end)[].id]')
  server=$(curl -sf -X POST "$api/servers" -H "Authorization: Bearer $token" -H 'content-type: application/json' \
    -d "{\"server\":{\"name\":\"bench\",\"associated_tools\":$tools}}" | jq -r .id)
  PEER_URL=$api/servers/$server/mcp
  PEER_HEADER="Authorization: Bearer $token"
  PEER_TOOL=stub-echo
}
