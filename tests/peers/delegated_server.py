"""An MCP server built on the Python SDK (not on anything of ours) that
accepts only delegated tokens, for the delegation tests: the SDK's bearer
middleware with a token verifier that checks, with PyJWT, each token's
signature against the provider's key, its issuer, its audience (this
server), its expiry, its scope, and that it names the gateway as the actor.

    delegated_server.py PORT KEYS_FILE ISSUER AUDIENCE ACTOR RECORD

KEYS_FILE is the provider's JWKS (tests/peers/oidc_provider.mjs writes it);
every call appends a JSON line to RECORD: the tool, the token's `sub`, its
`act`, its `jti`, the token itself, and the `X-Service-Key` header if one
came with it.
With SERVICE_TOKEN set, that token is accepted too, as the subject
`countersign-service` (the gateway's own credential, for its listing): a
test sees from the record whether a call ever came with it. Tools:
- `whoami` (readOnlyHint): the token's subject;
- `create_issue(title)`: a write, recorded like every call.
"""

import json
import os
import sys
from pathlib import Path

import jwt
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations

PORT = int(sys.argv[1])
KEYS = json.loads(Path(sys.argv[2]).read_text())
ISSUER, AUDIENCE, ACTOR = sys.argv[3], sys.argv[4], sys.argv[5]
RECORD = Path(sys.argv[6])
KEY = jwt.PyJWK(KEYS["keys"][0])
SERVICE_TOKEN = os.environ.get("SERVICE_TOKEN")


class Verifier:
    async def verify_token(self, token: str) -> AccessToken | None:
        if SERVICE_TOKEN and token == SERVICE_TOKEN:
            return AccessToken(
                token=token,
                client_id="countersign-service",
                scopes=["repo"],
                expires_at=None,
                resource=AUDIENCE,
                subject="countersign-service",
                claims={},
            )
        try:
            claims = jwt.decode(
                token,
                KEY.key,
                algorithms=["ES256"],
                audience=AUDIENCE,
                issuer=ISSUER,
                options={"require": ["exp", "sub", "aud", "iss"]},
            )
        except jwt.PyJWTError:
            return None
        # Only a token exchanged for a person, with the gateway as the actor.
        if (claims.get("act") or {}).get("sub") != ACTOR:
            return None
        return AccessToken(
            token=token,
            client_id=claims.get("client_id", ""),
            scopes=claims.get("scope", "").split(),
            expires_at=claims["exp"],
            resource=AUDIENCE,
            subject=claims["sub"],
            claims=claims,
        )


def record(tool: str, ctx: Context) -> str:
    t = get_access_token()
    claims = (t.claims or {}) if t else {}
    headers = ctx.headers or {}
    line = {
        "tool": tool,
        "sub": t.subject if t else None,
        "act": claims.get("act"),
        "jti": claims.get("jti"),
        "tid": claims.get("tid"),
        "x_service_key": headers.get("x-service-key"),
        # The token itself, so that a test can look for it where it must
        # never be (the gateway's log, audit log, metrics and traces).
        "token": t.token if t else None,
    }
    with RECORD.open("a") as f:
        f.write(json.dumps(line) + "\n")
    return line["sub"] or ""


server = MCPServer(
    "delegated",
    token_verifier=Verifier(),
    auth=AuthSettings(
        issuer_url=ISSUER,
        resource_server_url=AUDIENCE,
        required_scopes=["repo"],
    ),
)


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def whoami(ctx: Context) -> str:
    """Who the token says is calling."""
    return record("whoami", ctx)


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False))
def create_issue(title: str, ctx: Context) -> str:
    """Open an issue."""
    return f"issue '{title}' opened by {record('create_issue', ctx)}"


server.run("streamable-http", host="127.0.0.1", port=PORT)
