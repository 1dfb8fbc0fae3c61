"""The /_crawlergate/ endpoints: the dashboard, ``stats`` (JSON), ``series`` (the dashboard's history),
``metrics`` (Prometheus), ``healthz`` and ``invalidate``.

``healthz`` answers everyone. The others answer loopback clients (the client that a trusted proxy
forwards for, not the proxy itself), and, when a token is configured, whoever presents
``Authorization: Bearer <token>``. ``invalidate`` changes what crawlers are served, so it always
needs the token, from loopback too: ``POST`` a JSON body ``{"urls": [...], "patterns": [...]}``,
get ``{"marked": N}``.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable, Iterable
from typing import Any

import anyio
from starlette.types import Receive, Scope, Send

from crawlergate.admin.dashboard import Dashboard
from crawlergate.errors import CrawlerGateError
from crawlergate.gate.answer import Response, json_response, send_response
from crawlergate.gate.forwarded import TrustedProxies, is_loopback


class AdminEndpoints:
    """Answers admin requests; ``respond`` is interface-free, calling the object serves ASGI."""

    def __init__(
        self,
        *,
        prefix: str,
        token: str,
        stats: Callable[[], dict[str, Any]],
        prometheus: Callable[[], str] | None = None,
        invalidate: Callable[[list[str], list[str]], int] | None = None,
        trusted_proxies: Iterable[str] = (),
        dashboard: Dashboard | None = None,
    ) -> None:
        self.prefix = prefix
        self._dashboard = dashboard
        self._token = token.encode()
        self._stats = stats
        self._prometheus = prometheus
        self._invalidate = invalidate
        self._trusted = TrustedProxies(trusted_proxies)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client")
        body = b""
        if scope["method"] == "POST":
            while True:
                message = await receive()
                body += message.get("body", b"")
                if len(body) > MAX_BODY_BYTES:
                    await send_response(send, json_response(413, {"error": f"the body is over {MAX_BODY_BYTES} bytes"}))
                    return
                if message["type"] == "http.disconnect" or not message.get("more_body", False):
                    break
        peer = client[0] if client else None
        path: str = scope["path"]
        if path.endswith("/healthz"):  # asked every few seconds by load balancers: answered on the loop
            answer = self.respond(path, scope["method"], peer, scope["headers"], body)
        else:  # invalidate, stats and metrics read (or write) the page catalogue and regeneration records
            answer = await anyio.to_thread.run_sync(self.respond, path, scope["method"], peer, scope["headers"], body)
        await send_response(send, answer)

    def respond(
        self,
        path: str,
        method: str,
        client_host: str | None,
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes = b"",
    ) -> Response:
        name = path[len(self.prefix) :].strip("/")
        if len(body) > MAX_BODY_BYTES:
            return json_response(413, {"error": f"the body is over {MAX_BODY_BYTES} bytes"})
        if name == "healthz":
            return json_response(200, {"status": "ok"})
        if not self._allowed(client_host, headers):
            return json_response(403, {"error": "admin endpoints answer loopback clients or a valid bearer token"})
        if name == "invalidate" and self._invalidate is not None:
            return self._invalidation(method, headers, body)
        read_only = name in ("stats", "metrics", "series", "") or name.startswith("static/")
        if read_only and method not in ("GET", "HEAD"):
            return json_response(405, {"error": "use GET"}, extra=[(b"allow", b"GET, HEAD")])
        if self._dashboard is not None:
            answer = self._dashboard_answer(name)
            if answer is not None:
                return answer
        if name == "stats":
            return json_response(200, self._stats())
        if name == "metrics" and self._prometheus is not None:
            text = self._prometheus().encode()
            headers = [
                (b"content-type", b"text/plain; version=0.0.4; charset=utf-8"),
                (b"content-length", b"%d" % len(text)),
                (b"cache-control", b"no-store"),
                (b"x-crawlergate", b"pass"),
            ]
            return 200, headers, text
        endpoints = ["", "stats", "series", "metrics", "healthz", "invalidate"]
        return json_response(404, {"error": f"no admin endpoint {name!r}", "endpoints": endpoints})

    def _dashboard_answer(self, name: str) -> Response | None:
        assert self._dashboard is not None
        if name == "":
            return self._dashboard.page()
        if name == "series":
            return self._dashboard.series()
        if name.startswith("static/"):
            return self._dashboard.asset(name.removeprefix("static/"))
        return None

    def _invalidation(self, method: str, headers: Iterable[tuple[bytes, bytes]], body: bytes) -> Response:
        assert self._invalidate is not None
        if method != "POST":
            return json_response(405, {"error": "use POST"}, extra=[(b"allow", b"POST")])
        if not self._token:
            return json_response(403, {"error": "invalidate needs the setting admin.token (CRAWLERGATE_ADMIN_TOKEN)"})
        if not self._has_token(headers):
            return json_response(
                401, {"error": "invalidate needs Authorization: Bearer <admin token>"}, extra=_CHALLENGE
            )
        try:
            request = json.loads(body or b"{}")
        except (ValueError, RecursionError):
            return json_response(400, {"error": 'the body must be JSON: {"urls": [...], "patterns": [...]}'})
        urls = _strings(request.get("urls", []) if isinstance(request, dict) else None)
        patterns = _strings(request.get("patterns", []) if isinstance(request, dict) else None)
        if urls is None or patterns is None:
            return json_response(
                400, {"error": '"urls" and "patterns" must be lists of strings, e.g. {"urls": ["/t/1"]}'}
            )
        if len(patterns) > MAX_PATTERNS:
            return json_response(400, {"error": f"at most {MAX_PATTERNS} patterns a request"})
        try:
            return json_response(200, {"marked": self._invalidate(urls, patterns)})
        except CrawlerGateError as exc:
            return json_response(503, {"error": str(exc)}, extra=[(b"retry-after", b"5")])

    def allows(self, scope: Scope) -> bool:
        """Whether a request may read the admin endpoints (a loopback client or the bearer token)."""
        client = scope.get("client")
        return self._allowed(client[0] if client else None, scope["headers"])

    def _allowed(self, peer: str | None, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        # Behind an nginx on the same host every peer is loopback: the forwarded client is what counts.
        return is_loopback(self._trusted.privileged_client(peer, headers)) or self._has_token(headers)

    def _has_token(self, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        if not self._token:
            return False
        for header, value in headers:
            if header == b"authorization" and value.startswith(b"Bearer "):
                return hmac.compare_digest(value[7:].strip(), self._token)
        return False


# The largest invalidate body read (about 10,000 URLs), and the most patterns in it (each reads the index).
MAX_BODY_BYTES = 1 << 20
MAX_PATTERNS = 1000
_CHALLENGE = [(b"www-authenticate", b"Bearer")]


def _strings(value: object) -> list[str] | None:
    """``value`` when it is a list of strings that are text (no lone surrogates), else None."""
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        return None
    try:
        for item in value:
            item.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return value
