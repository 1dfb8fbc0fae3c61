"""The /_crawlergate/ endpoints: ``stats`` (JSON), ``metrics`` (Prometheus) and ``healthz``, ASGI and WSGI alike.

``healthz`` answers everyone. The others answer loopback clients (the client that a trusted proxy
forwards for, not the proxy itself), and, when a token is configured, whoever presents
``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import Callable, Iterable
from typing import Any

from starlette.types import Receive, Scope, Send

from crawlergate.gate.answer import Response, send_response
from crawlergate.gate.forwarded import TrustedProxies


class AdminEndpoints:
    """Answers admin requests; ``respond`` is interface-free, calling the object serves ASGI."""

    def __init__(
        self,
        *,
        prefix: str,
        token: str,
        stats: Callable[[], dict[str, Any]],
        prometheus: Callable[[], str] | None = None,
        trusted_proxies: Iterable[str] = (),
    ) -> None:
        self.prefix = prefix
        self._token = token.encode()
        self._stats = stats
        self._prometheus = prometheus
        self._trusted = TrustedProxies(trusted_proxies)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client")
        await send_response(
            send, self.respond(scope["path"], scope["method"], client[0] if client else None, scope["headers"])
        )

    def respond(
        self, path: str, method: str, client_host: str | None, headers: Iterable[tuple[bytes, bytes]]
    ) -> Response:
        name = path[len(self.prefix) :].strip("/")
        if name == "healthz":
            return _json(200, {"status": "ok"})
        if not self._allowed(client_host, headers):
            return _json(403, {"error": "admin endpoints answer loopback clients or a valid bearer token"})
        if name in ("stats", "metrics") and method not in ("GET", "HEAD"):
            return _json(405, {"error": "use GET"}, extra=[(b"allow", b"GET, HEAD")])
        if name == "stats":
            return _json(200, self._stats())
        if name == "metrics" and self._prometheus is not None:
            text = self._prometheus().encode()
            headers = [
                (b"content-type", b"text/plain; version=0.0.4; charset=utf-8"),
                (b"content-length", b"%d" % len(text)),
                (b"cache-control", b"no-store"),
                (b"x-crawlergate", b"pass"),
            ]
            return 200, headers, text
        return _json(404, {"error": f"no admin endpoint {name!r}", "endpoints": ["stats", "metrics", "healthz"]})

    def _allowed(self, peer: str | None, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        # Behind an nginx on the same host every peer is loopback: the forwarded client is what counts.
        client_host = self._trusted.client(peer, headers)
        if _is_loopback(client_host):
            return True
        if not self._token:
            return False
        for header, value in headers:
            if header == b"authorization" and value.startswith(b"Bearer "):
                return hmac.compare_digest(value[7:].strip(), self._token)
        return False


def _is_loopback(host: str | None) -> bool:
    # No address at all (a Unix socket) is not loopback: whoever is behind it cannot be told apart.
    if host is None:
        return False
    try:
        return ipaddress.ip_address(host.removeprefix("::ffff:")).is_loopback
    except ValueError:
        return False


def _json(status: int, body: dict[str, Any], extra: list[tuple[bytes, bytes]] | None = None) -> Response:
    data = json.dumps(body, indent=2, sort_keys=True).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(data)),
        (b"cache-control", b"no-store"),
        (b"x-crawlergate", b"pass"),
    ]
    return status, headers + (extra or []), data
