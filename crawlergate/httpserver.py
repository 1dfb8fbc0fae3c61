"""uvicorn's httptools protocol with the limits a server facing the internet needs, as nginx has them.

uvicorn reads a request's headers without bound: ten requests with 100 MB of headers took the gate
to 1 GB, and a slowloris (headers sent a byte at a time) holds a connection for ever. Here the head
of a request (request line and headers) is capped in bytes and in header count (431 past either,
as nginx's ``large_client_header_buffers``), and must arrive within a time limit
(``client_header_timeout``), after which the connection is closed.

    HeadLimits.apply(settings.server)   # before uvicorn starts, and in each worker
    uvicorn.run(app, http=LimitedHttpToolsProtocol)
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from crawlergate.config import ServerSettings


class HeadLimits:
    """The limits every connection of this process applies (set once, from the settings)."""

    max_bytes = 64 * 1024
    max_headers = 100
    timeout_s = 10.0

    @classmethod
    def apply(cls, settings: ServerSettings) -> None:
        cls.max_bytes = settings.max_header_bytes
        cls.max_headers = settings.max_headers
        cls.timeout_s = settings.header_timeout_seconds


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """HttpToolsProtocol that refuses oversized heads (431) and closes connections whose head is late."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0
        self._header_count = 0
        # True from the first byte of a request until its headers are complete.
        self._reading_head = True
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._reading_head:
            self._head_bytes += len(data)
            if self._head_bytes > HeadLimits.max_bytes:
                self._refuse_head()
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading_head = True
        self._header_count = 0
        if self._head_timer is None:
            self._start_head_timer()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count <= HeadLimits.max_headers:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._reading_head = False
        self._stop_head_timer()
        if self._header_count > HeadLimits.max_headers:
            self._refuse_head()  # the request never reaches the app
            return
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        # The next request's head starts counting afresh; its timer starts with its first byte.
        self._head_bytes = 0
        self._reading_head = True
        super().on_response_complete()

    def _start_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(HeadLimits.timeout_s, self._head_too_late)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_late(self) -> None:
        self._head_timer = None
        if self._reading_head and self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _refuse_head(self) -> None:
        self._stop_head_timer()
        if self.transport is None or self.transport.is_closing():
            return
        body = b"Request header fields too large.\n"
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
        )
        self.transport.close()
