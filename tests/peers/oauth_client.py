"""Sign in to countersign the way an MCP client does, with the Python MCP SDK's
own OAuth client (`mcp.client.auth.OAuthClientProvider`), and make one write
that a reviewer must approve.

Usage:
  oauth_client.py URL MODE LOGIN KEY

The SDK meets the gateway's 401, reads its RFC 9728 metadata to find the
authorization server, registers itself there (RFC 7591), and runs the
authorization code grant with PKCE for the resource URL (RFC 8707). The
browser step is played here: the redirect handler follows the provider's
development login and consent pages, signs in as LOGIN, and hands the code
from the redirect back to the SDK. Then a `charge_card` with idempotency
key KEY, held by the gateway until a reviewer decides, and the same call
again (a replay).

MODE is the SDK's `mode`: "legacy" (initialize handshake) or "auto".
Prints one JSON object with what the session saw; the Rust test asserts
on it.
"""

import asyncio
import json
import sys
from html.parser import HTMLParser
from urllib.parse import parse_qs, urljoin, urlparse

import httpx2  # the SDK's HTTP client
from mcp import Client
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

REDIRECT = "http://127.0.0.1:9/callback"  # never reached: the handler stops at it


class Memory:
    """The SDK's TokenStorage, in memory; remembers what it was given."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


class Form(HTMLParser):
    """The first form of a page: its action and its inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.action: str | None = None
        self.fields: dict[str, str] = {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "form" and self.action is None:
            self.action = a.get("action")
        elif tag == "input" and a.get("name"):
            self.fields[a["name"]] = a.get("value") or ""


class Browser:
    """Plays the person at the provider's pages: follows redirects, signs in
    as `login` and consents, until the provider redirects to REDIRECT."""

    def __init__(self, login: str) -> None:
        self.login = login
        self.result: AuthorizationCodeResult | None = None
        self.pages: list[str] = []

    async def open(self, url: str) -> None:
        async with httpx2.AsyncClient(follow_redirects=False, timeout=30) as http:
            resp = await http.get(url)
            for _ in range(20):
                if resp.status_code in (302, 303):
                    target = urljoin(str(resp.url), resp.headers["location"])
                    if target.startswith(REDIRECT):
                        q = parse_qs(urlparse(target).query)
                        if "error" in q:
                            raise SystemExit(f"the provider refused: {q}")
                        self.result = AuthorizationCodeResult(
                            code=q["code"][0], state=q.get("state", [None])[0], iss=q.get("iss", [None])[0]
                        )
                        return
                    resp = await http.get(target)
                elif resp.status_code == 200:
                    form = Form()
                    form.feed(resp.text)
                    if form.action is None:
                        raise SystemExit(f"no form on {resp.url}: {resp.text[:300]}")
                    self.pages.append(form.fields.get("prompt", "?"))
                    data = dict(form.fields)
                    if data.get("prompt") == "login":
                        data["login"] = self.login
                        data["password"] = "any"
                    resp = await http.post(urljoin(str(resp.url), form.action), data=data)
                else:
                    raise SystemExit(f"unexpected {resp.status_code} from {resp.url}: {resp.text[:300]}")
            raise SystemExit("too many steps at the provider")

    async def callback(self) -> AuthorizationCodeResult:
        assert self.result is not None, "the provider never redirected back"
        return self.result


async def main() -> None:
    url, mode, login, key = sys.argv[1:5]
    storage = Memory()
    browser = Browser(login)
    auth = OAuthClientProvider(
        server_url=url,
        client_metadata=OAuthClientMetadata(
            client_name="py-mcp-oauth",
            redirect_uris=[REDIRECT],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
        ),
        storage=storage,
        redirect_handler=browser.open,
        callback_handler=browser.callback,
    )
    transport = streamable_http_client(url, http_client=create_mcp_http_client(auth=auth))
    async with Client(transport, mode=mode) as client:
        await client.list_tools()
        args = {"account": "acct_7", "amount": 9}
        meta = {"dev.countersign/idempotency-key": key}
        first = await client.call_tool("charge_card", args, read_timeout_seconds=60, meta=meta)
        again = await client.call_tool("charge_card", args, read_timeout_seconds=60, meta=meta)
        out = {
            "protocol_version": client.protocol_version,
            "client_id": storage.client.client_id if storage.client else None,
            "scope": storage.tokens.scope if storage.tokens else None,
            "pages": browser.pages,
            "is_error": first.is_error,
            "text": first.content[0].text,
            "again_is_error": again.is_error,
            "again_meta": again.model_dump(by_alias=True, mode="json").get("_meta"),
        }
    print(json.dumps(out))


asyncio.run(main())
