"""The project as an ASGI application inside CrawlerGateMiddleware: ``uvicorn examples.django_site.asgi:application``.

Django's ASGI handler refuses the lifespan protocol (it raises on any scope but ``http``). The gate
opens its stores at the first request anyway, but closes them, and writes what it counted, only at
lifespan shutdown: ``with_lifespan`` answers the lifespan messages for Django, so the gate sees them.
"""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application
from starlette.types import ASGIApp, Receive, Scope, Send

from crawlergate import CrawlerGateMiddleware
from examples.django_site.gate import gate_settings

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_site.settings")
django_application = get_asgi_application()


def with_lifespan(app: ASGIApp) -> ASGIApp:
    """``app`` with an empty lifespan: startup and shutdown succeed, everything else goes to ``app``."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    return wrapped


def create_application(cache_dir: str | None = None) -> CrawlerGateMiddleware:
    """Django inside the gate; lifespan startup opens the gate's stores, shutdown closes them."""
    return CrawlerGateMiddleware(with_lifespan(django_application), settings=gate_settings(cache_dir))


application = create_application()
