"""A request's body read whole before the origin is asked (nginx's ``proxy_request_buffering``, on by default).

Streamed as it arrives, a body ties one of the origin's workers to the client for as long as the client takes
to send it: a PHP-FPM pool, gunicorn's sync workers or Apache's prefork children are few, and six clients
sending a byte every two seconds held a four-worker origin for as long as they liked. Read whole first, a slow
body holds a connection of the gate's, which has thousands, and the origin gets it at once.

A body up to MEMORY_BYTES (64 KiB) waits in memory, a larger one in a temporary file (as nginx's client_body_temp); a
body over ``max_bytes`` is refused with 413 (``client_max_body_size``), one whose next bytes take longer than
``timeout_s`` with 408 (``client_body_timeout``).

    body = await BufferedBody.read(receive, timeout_s=60, max_bytes=2**30)
    async for chunk in body.chunks():  # closes the file at the end
        ...
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from typing import IO

from starlette.types import Receive

# A body up to this size waits in memory; past it, in a temporary file: no more a connection than streaming held.
MEMORY_BYTES = 64 * 1024
# What a body in a file is sent on in.
CHUNK_BYTES = 64 * 1024


class ClientLeft(Exception):
    """The client left before its body ended: nothing is sent to the origin."""


class BodyRefused(Exception):
    """A body the gate will not send on: the client is answered ``status`` with ``message``, and the connection
    closed (the rest of the body is not read)."""

    status = 400
    message = b"Bad Request\n"


class BodyTooSlow(BodyRefused):
    status = 408
    message = b"The request body came too slowly.\n"


class BodyTooLarge(BodyRefused):
    status = 413
    message = b"The request body is too large.\n"


class BufferedBody:
    """A request's body, received whole: in memory, or in a temporary file when large."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._size = 0
        self._file: IO[bytes] | None = None

    @classmethod
    async def read(cls, receive: Receive, *, timeout_s: float, max_bytes: int) -> BufferedBody:
        """Receive the whole body; raises ClientLeft, BodyTooSlow or BodyTooLarge (the file closed)."""
        body = cls()
        try:
            while True:
                try:
                    async with asyncio.timeout(timeout_s):
                        message = await receive()
                except TimeoutError:
                    raise BodyTooSlow from None
                if message["type"] == "http.disconnect":
                    raise ClientLeft
                chunk = message.get("body", b"")
                if chunk:
                    body._add(chunk, max_bytes)
                if not message.get("more_body", False):
                    return body
        except BaseException:
            body.close()
            raise

    def _add(self, chunk: bytes, max_bytes: int) -> None:
        self._size += len(chunk)
        if self._size > max_bytes:
            raise BodyTooLarge
        if self._file is None:
            if self._size <= MEMORY_BYTES:
                self._chunks.append(chunk)
                return
            self._file = tempfile.TemporaryFile(prefix="crawlergate-body-")  # noqa: SIM115 - closed by close()
            for held in self._chunks:
                self._file.write(held)
            self._chunks = []
        self._file.write(chunk)

    @property
    def size(self) -> int:
        return self._size

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, in the pieces it came in (from memory) or in CHUNK_BYTES (from its file), then closed."""
        try:
            if self._file is None:
                for chunk in self._chunks:
                    yield chunk
                return
            self._file.seek(0)
            while block := self._file.read(CHUNK_BYTES):
                yield block
        finally:
            self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
