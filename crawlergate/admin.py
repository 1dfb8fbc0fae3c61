"""The /_crawlergate/ endpoints: ``stats`` (JSON) and ``healthz``.

``healthz`` answers everyone. The others answer loopback clients, and, when a token is
configured, whoever presents ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from typing import Any

from starlette.types import Receive, Scope, Send

_LOOPBACK_PREFIXES = ("127.", "::1", "localhost")


class AdminEndpoints:
    """A small ASGI app mounted under the admin prefix."""

    def __init__(self, *, prefix: str, token: str, stats: Callable[[], dict[str, Any]]) -> None:
        self.prefix = prefix
        self._token = token.encode()
        self._stats = stats

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = scope["path"][len(self.prefix) :].strip("/")
        if name == "healthz":
            await _json(send, 200, {"status": "ok"})
            return
        if not self._allowed(scope):
            await _json(send, 403, {"error": "admin endpoints answer loopback clients or a valid bearer token"})
            return
        if name == "stats":
            if scope["method"] not in ("GET", "HEAD"):
                await _json(send, 405, {"error": "use GET"}, extra=[(b"allow", b"GET, HEAD")])
                return
            await _json(send, 200, self._stats())
            return
        await _json(send, 404, {"error": f"no admin endpoint {name!r}", "endpoints": ["stats", "healthz"]})

    def _allowed(self, scope: Scope) -> bool:
        client = scope.get("client")
        if client is None or str(client[0]).startswith(_LOOPBACK_PREFIXES):
            return True
        if not self._token:
            return False
        for header, value in scope["headers"]:
            if header == b"authorization" and value.startswith(b"Bearer "):
                return hmac.compare_digest(value[7:].strip(), self._token)
        return False


async def _json(send: Send, status: int, body: dict[str, Any], extra: list[tuple[bytes, bytes]] | None = None) -> None:
    data = json.dumps(body, indent=2, sort_keys=True).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
        (b"cache-control", b"no-store"),
        (b"x-crawlergate", b"pass"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": data})
