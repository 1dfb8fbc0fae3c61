"""Guest sub-requests: fetch the public guest copy of a URL from the site, the same way in every deployment.

The request carries a fixed, sanitised header set (no Cookie, no Authorization, no client
forwarding headers, the canonical Host), so what is stored is exactly the guest page of the key.
httpx does the fetching with an injected transport: ``httpx.ASGITransport(app)`` when the gate is
mounted in the site (and for the proxy, whose inner app forwards to the origin). httpx errors are
translated here, once, into OriginError and OriginTimeout; nothing above this module sees httpx.

    client = OriginClient(httpx.ASGITransport(app), canonical_host="forum.example")
    response = await client.fetch_guest("/showthread.php?t=12")
"""

from __future__ import annotations

from dataclasses import dataclass

import anyio
import httpx

from crawlergate import __version__
from crawlergate.errors import OriginError, OriginTimeout

GUEST_USER_AGENT = f"crawlergate/{__version__} (guest page fill)"


class PageTooLarge(OriginError):
    """Raised when a guest page exceeds the size limit, likely a download rather than a page."""


@dataclass(frozen=True, slots=True)
class OriginResponse:
    """What the site answered to a guest sub-request; header names are lower-case."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def all(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key == name]


class OriginClient:
    """Fetches guest copies of pages.

    Parameters:
        transport: where requests go; an ``httpx.ASGITransport`` for an in-process site.
        canonical_host: the Host header of every guest request.
        timeout_s: the whole fetch, connect to last byte.
        max_bytes: a larger body raises PageTooLarge.
    """

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport,
        *,
        canonical_host: str,
        scheme: str = "http",
        timeout_s: float = 30.0,
        max_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        self._client = httpx.AsyncClient(
            transport=transport,
            base_url=f"{scheme}://{canonical_host}",
            timeout=timeout_s,
            follow_redirects=False,
        )
        self._max_bytes = max_bytes
        self._timeout_s = timeout_s
        self._headers = {
            "user-agent": GUEST_USER_AGENT,
            "accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
            "accept-encoding": "identity",
        }

    async def fetch_guest(self, target: str) -> OriginResponse:
        """GET ``target`` (a normalised path and query) as an anonymous guest."""
        try:
            # httpx enforces its timeouts on network transports only; an in-process app gets this deadline.
            with anyio.fail_after(self._timeout_s):
                return await self._fetch(target)
        except TimeoutError as exc:
            raise OriginTimeout(f"{target}: the origin did not answer within {self._timeout_s:g} s") from exc

    async def _fetch(self, target: str) -> OriginResponse:
        try:
            async with self._client.stream("GET", target, headers=self._headers) as response:
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > self._max_bytes:
                        raise PageTooLarge(f"{target}: more than {self._max_bytes} bytes")
                    chunks.append(chunk)
                headers = tuple((name.lower(), value) for name, value in response.headers.multi_items())
                return OriginResponse(response.status_code, headers, b"".join(chunks))
        except httpx.TimeoutException as exc:
            raise OriginTimeout(f"{target}: the origin did not answer in time") from exc
        except httpx.HTTPError as exc:
            raise OriginError(f"{target}: {type(exc).__name__}: {exc}") from exc
        except OSError as exc:
            raise OriginError(f"{target}: {exc}") from exc

    async def aclose(self) -> None:
        await self._client.aclose()
