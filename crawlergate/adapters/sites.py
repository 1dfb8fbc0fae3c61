"""Several sites behind one ``serve``: each request goes to the gate of the site its Host names.

Each site (``[[sites]]``, ``--site HOST=ORIGIN``) has a gate of its own, built from the top-level
settings with the site's origin and URL: its own L2 folder, memcached namespace, share of L2,
counters, access log, regeneration window and admin endpoints (asked with the site's Host). So a
page is stored under its site, and a client cannot poison one site's page by sending another's
Host. A request for a host no site names is never looked up, stored or filled: it gets 421
(``server.other_hosts = "refuse"``) or goes to the first site's origin untouched (``"first"``).
Admin requests on such a host (``curl 127.0.0.1:8080/_crawlergate/stats``) get every site's figures
and their totals.

    app = SiteGates.from_settings(settings)  # an ASGI app, and serve's protocol's answer_at_once
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterable
from typing import Any

from starlette.types import Receive, Scope, Send

from crawlergate.adapters.asgi import CrawlerGateMiddleware
from crawlergate.admin.endpoints import AdminEndpoints
from crawlergate.config import Settings
from crawlergate.gate.answer import Later, Response, json_response, plain_response, send_response
from crawlergate.gate.forwarded import TrustedProxies
from crawlergate.gate.request import Request

CLASSES = ("crawler", "human", "suspect")
_MISDIRECTED = b"This server answers for other host names (421 Misdirected Request).\n"
_WHICH_SITE = "pages are marked on one site: send its Host (crawlergate invalidate --host HOST, or full URLs)"
_OVERVIEW = """<!doctype html><html><head><meta charset="utf-8"><meta http-equiv="refresh" content="10">
<title>crawlergate: sites</title><style>body{font:15px system-ui,sans-serif;margin:2em}td,th{padding:.3em 1em;
text-align:right}td:first-child,th:first-child{text-align:left}</style></head><body><h1>Sites behind this gate</h1>
<table><tr><th>site (its dashboard)</th><th>crawler requests</th><th>crawler hit ratio</th><th>crawler TTFB p50 ms</th>
<th>human requests</th></tr>{{ROWS}}</table><p>Every 10 s. Each site's dashboard answers at its own host name.</p>
</body></html>"""
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})? (.*)$")


class SiteGates:
    """An ASGI app in front of one gate per site, chosen by the request's Host."""

    def __init__(self, gates: dict[str, CrawlerGateMiddleware], settings: Settings) -> None:
        self.gates = gates
        self._by_host = {host.encode(): gates[site.name] for site in settings.sites for host in site.hosts}
        self._first = gates[settings.sites[0].name]
        self._pass_others = settings.server.other_hosts == "first"
        self._prefix = settings.admin.prefix
        self._trusted = TrustedProxies(settings.server.trusted_proxies)
        self.admin = AdminEndpoints(
            prefix=settings.admin.prefix,
            token=settings.admin.token,
            stats=self.stats,
            prometheus=self.prometheus,
            trusted_proxies=settings.server.trusted_proxies,
        )

    @classmethod
    def from_settings(cls, settings: Settings, build: Callable[[Settings], CrawlerGateMiddleware]) -> SiteGates:
        """A gate per site, each built by ``build`` from the site's settings (``Settings.for_site``)."""
        return cls({site.name: build(settings.for_site(site)) for site in settings.sites}, settings)

    def gate_for(self, peer: str | None, headers: Iterable[tuple[bytes, bytes]]) -> CrawlerGateMiddleware | None:
        """The gate of the site the request names: X-Forwarded-Host when a trusted proxy sent it (a front nginx
        that keeps its own Host), else Host; with its port, else without. None for another host."""
        host = forwarded = None
        for name, value in headers:
            if name == b"host":
                host = value
            elif name == b"x-forwarded-host":
                forwarded = value
        if forwarded is not None and peer in self._trusted:
            host = forwarded.rpartition(b",")[2].strip()  # the nearest proxy's, as X-Forwarded-For's last hop
        if host is None:
            return None
        host = host.lower()
        gate = self._by_host.get(host)
        if gate is None and not host.endswith(b"]"):
            name, colon, port = host.rpartition(b":") if b":" in host else (host, b"", b"")
            name = name.rstrip(b".")  # the root's dot: "forum.example." is forum.example
            gate = self._by_host.get(name + colon + port) or self._by_host.get(name)
        return gate

    def answer_at_once(self, request: Request, started: float, scope: Scope, may_wait: bool) -> Response | Later | None:
        gate = self.gate_for(request.peer, request.headers)
        return gate.answer_at_once(request, started, scope, may_wait) if gate is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        client = scope.get("client")
        gate = self.gate_for(client[0] if client else None, scope.get("headers", ()))
        if gate is not None:
            await gate(scope, receive, send)
        elif scope["type"] == "http" and (scope["path"] + "/").startswith(self._prefix + "/"):
            if scope["path"].rstrip("/").endswith("/invalidate"):
                await send_response(send, json_response(421, {"error": _WHICH_SITE}))
                return
            if scope["path"].rstrip("/") == self._prefix and self.admin.allows(scope):
                await send_response(send, self._overview(scope))
                return
            await self.admin(scope, receive, send)
        elif self._pass_others:
            await self._first.app(scope, receive, send)  # the site itself: nothing looked up, stored or filled
        elif scope["type"] == "http":
            await send_response(send, plain_response(421, _MISDIRECTED, outcome=b"pass"))
        else:
            await send({"type": "websocket.close", "code": 1008})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    for gate in self.gates.values():
                        gate.start_serving()
                except Exception as exc:  # noqa: BLE001 - uvicorn prints the reason and stops
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                for gate in self.gates.values():
                    await gate.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _overview(self, scope: Scope) -> Response:
        """Every site's crawler figures on one page, each linked to its own dashboard (asked with its Host, on
        the port this page was asked on: a tunnel's, with the site's name in /etc/hosts)."""
        asked = next((value for name, value in scope["headers"] if name == b"host"), b"")
        port = asked.rpartition(b":")[2].decode("latin-1") if not asked.endswith(b"]") and b":" in asked else ""
        rows = []
        for name, figures in self.stats()["sites"].items():
            crawler, human = figures.get("crawler", {}), figures.get("human", {})
            ttfb = crawler.get("ttfb_ms", {}).get("p50", 0.0)
            where = f"{name}:{port}" if port.isdigit() and ":" not in name else name
            rows.append(
                f'<tr><td><a href="//{html.escape(where)}{self._prefix}/">'
                f"{html.escape(name)}</a></td>"
                f"<td>{crawler.get('requests', 0):,}</td><td>{crawler.get('hit_ratio', 0.0):.1%}</td>"
                f"<td>{ttfb:.2f}</td><td>{human.get('requests', 0):,}</td></tr>"
            )
        page = _OVERVIEW.replace("{{ROWS}}", "".join(rows)).encode()
        headers = [(b"content-type", b"text/html; charset=utf-8"), (b"cache-control", b"no-store")]
        return 200, [*headers, (b"content-length", b"%d" % len(page)), (b"x-crawlergate", b"pass")], page

    def reopen_logs(self) -> None:
        """Open every site's access log again (SIGHUP, after logrotate moved them)."""
        for gate in self.gates.values():
            if gate.access_log is not None:
                gate.access_log.reopen()

    def stats(self) -> dict[str, Any]:
        """Each site's ``stats``, and their totals per class (requests and outcomes add up; the ratio of sums)."""
        sites = {name: gate.stats() for name, gate in self.gates.items()}
        totals: dict[str, Any] = {}
        for kind in CLASSES:
            counts: dict[str, int] = {}
            for figures in sites.values():
                of_kind = figures.get(kind)
                for field, value in of_kind.items() if isinstance(of_kind, dict) else ():
                    if isinstance(value, int) and not isinstance(value, bool):
                        counts[field] = counts.get(field, 0) + value
            hits = counts.get("l1_hits", 0) + counts.get("l2_hits", 0) + counts.get("direct_hits", 0)
            lookups = hits + counts.get("misses", 0) + counts.get("stale", 0)
            totals[kind] = {**counts, "hit_ratio": round(hits / lookups, 4) if lookups else 0.0}
        return {**totals, "sites": sites}

    def prometheus(self) -> str:
        """Every site's metrics in one exposition, each sample labelled with its ``site``, one group per metric."""
        groups: dict[str, list[str]] = {}
        for name, gate in self.gates.items():
            label = 'site="' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'
            group = groups.setdefault("", [])
            for line in gate.runtime.figures.prometheus().splitlines():
                if line.startswith("#"):
                    group = groups.setdefault(line.split(" ", 3)[2] if line.count(" ") >= 2 else "", [])
                    if line not in group:
                        group.append(line)
                    continue
                sample = _SAMPLE.match(line)
                if sample is not None:
                    metric, _, labels, value = sample.groups()
                    group.append(f"{metric}{{{label}{',' + labels if labels else ''}}} {value}")
        return "\n".join(line for group in groups.values() for line in group) + "\n"
