"""Signed agents' public keys: each operator's key directory (a JSON Web Key Set at
``/.well-known/http-message-signatures-directory``), fetched off the request path and kept as fresh as its
answer says.

A request never waits for the network: ``keys(origin)`` answers from what was fetched before, and when that is
nothing yet, or stale, it asks the fetching thread for the directory and answers with what it has (None: not
known yet). Fetches have a timeout and a size cap, follow no redirect, and keep a directory for its
``Cache-Control: max-age`` within bounds; a failed fetch keeps the keys it had and is tried again later.

    directories = KeyDirectories(timeout_s=5, max_bytes=65536, min_s=300, max_s=86400)
    keys = directories.keys("https://chatgpt.com")   # {thumbprint: key}, or None while it is fetched
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import logging
import re
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import certifi
import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from crawlergate.errors import ConfigError
from crawlergate.forksafe import after_fork_in_child

logger = logging.getLogger(__name__)

DIRECTORY_PATH = "/.well-known/http-message-signatures-directory"
# A directory that could not be fetched is asked for again after this long.
RETRY_AFTER_FAILURE_S = 60.0
# Keys kept per directory (a directory holds a few: the current one and the next).
MAX_KEYS = 16
_MAX_AGE = re.compile(r"(?:^|,)\s*max-age\s*=\s*\"?(\d+)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class PublishedKey:
    """One Ed25519 key of a directory, with the validity its JWK gives (``nbf``/``exp``, seconds; 0: none)."""

    key: Ed25519PublicKey
    not_before: float = 0.0
    expires: float = 0.0

    def valid_at(self, now: float) -> bool:
        return (not self.not_before or now >= self.not_before) and (not self.expires or now < self.expires)


@dataclass(slots=True)
class _Directory:
    keys: dict[str, PublishedKey] | None  # None: never fetched
    fresh_until: float
    asked: bool = False  # a fetch is queued or under way
    fetched_at: float = 0.0  # when the last fetch ended, whatever its outcome


class KeyDirectories:
    """The key directories of the operators' origins, fetched by one thread per process."""

    def __init__(
        self,
        *,
        timeout_s: float,
        max_bytes: int,
        min_s: float,
        max_s: float,
        ca_file: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.timeout_s = timeout_s
        self.tls = tls_context(ca_file)
        self.max_bytes = max_bytes
        self.min_s = min_s
        self.max_s = max_s
        self._clock = clock
        self.fetches = 0
        self.failures = 0
        self._forget_parent()
        after_fork_in_child(self, KeyDirectories._forget_parent)

    def _forget_parent(self) -> None:
        self._directories: dict[str, _Directory] = {}
        self._queue: deque[str] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def keys(self, origin: str) -> dict[str, PublishedKey] | None:
        """The keys ``origin`` publishes by their JWK thumbprint, as last fetched; None while not known yet. A
        directory not known or stale is asked for, in the background."""
        directory = self._directories.get(origin)
        if directory is None or (directory.fresh_until <= self._clock() and not directory.asked):
            self._ask(origin)
            return directory.keys if directory is not None else None
        return directory.keys

    def refetch_for_unknown_key(self, origin: str) -> bool:
        """A signature names a key ``origin``'s directory did not publish when last fetched: the operator may have
        rotated its keys since. The directory is asked for again (True) when that fetch ended more than
        ``RETRY_AFTER_FAILURE_S`` ago, so made-up key ids cost the operator one fetch a minute at most."""
        directory = self._directories.get(origin)
        if directory is None or directory.asked or self._clock() - directory.fetched_at < RETRY_AFTER_FAILURE_S:
            return False
        self._ask(origin)
        return True

    def status(self) -> dict[str, object]:
        now = self._clock()
        return {
            "fetches": self.fetches,
            "failures": self.failures,
            "directories": {
                origin: {"keys": len(entry.keys or {}), "fresh_s": max(0, round(entry.fresh_until - now))}
                for origin, entry in sorted(self._directories.items())
            },
        }

    def close(self) -> None:
        thread = self._thread
        if thread is not None:
            self._stopping.set()
            self._wake.set()
            thread.join(timeout=self.timeout_s + 5)
            self._thread = None

    def _ask(self, origin: str) -> None:
        with self._lock:
            directory = self._directories.setdefault(origin, _Directory(None, 0.0))
            if directory.asked:
                return
            directory.asked = True
            self._queue.append(origin)
            if self._thread is None and not self._stopping.is_set():
                self._thread = threading.Thread(target=self._run, name="crawlergate-key-directories", daemon=True)
                self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait()
            self._wake.clear()
            while self._queue and not self._stopping.is_set():
                self.fetch(self._queue.popleft())

    def fetch(self, origin: str) -> None:
        """Fetch ``origin``'s directory now, whole within the timeout (the thread's work; tests call it to wait)."""
        self.fetches += 1
        keys: dict[str, PublishedKey] | None = None
        fresh_s = RETRY_AFTER_FAILURE_S
        try:
            # One deadline for everything (connecting, TLS, a head sent a byte at a time, endless 1xx answers, a
            # trickled body): the timeouts of a client are per read, and a directory could hold the thread for days.
            keys, fresh_s = asyncio.run(asyncio.wait_for(self._download(origin), self.timeout_s))
        except TimeoutError:
            self.failures += 1
            logger.warning("key directory of %s: not whole within %g s (its signed agents are judged without it)",
                           origin, self.timeout_s)  # fmt: skip
        except Exception as exc:  # whatever a directory sends, the thread goes on with the others
            self.failures += 1
            logger.warning("key directory of %s: %s (its signed agents are judged without it)", origin, exc)
        finally:
            with self._lock:
                directory = self._directories.setdefault(origin, _Directory(None, 0.0))
                if keys is not None:
                    directory.keys = keys
                directory.fetched_at = self._clock()
                directory.fresh_until = directory.fetched_at + fresh_s
                directory.asked = False

    async def _download(self, origin: str) -> tuple[dict[str, PublishedKey], float]:
        # Identity only, the bytes counted as they come: a small gzip could decode to a huge body.
        headers = {"accept": "application/json", "accept-encoding": "identity"}
        async with (
            httpx.AsyncClient(timeout=self.timeout_s, follow_redirects=False, verify=self.tls) as client,
            client.stream("GET", origin + DIRECTORY_PATH, headers=headers) as answer,
        ):
            if answer.status_code != 200:
                raise DirectoryError(f"status {answer.status_code}")
            if answer.headers.get("content-encoding", "identity").lower() != "identity":
                raise DirectoryError("answered compressed though asked for identity")
            body = bytearray()
            async for chunk in answer.aiter_raw():
                body += chunk
                if len(body) > self.max_bytes:
                    raise DirectoryError(f"larger than {self.max_bytes} bytes")
            return parse_directory(bytes(body)), self._freshness(answer.headers.get("cache-control", ""))

    def _freshness(self, cache_control: str) -> float:
        found = _MAX_AGE.search(cache_control)
        max_age = float(found.group(1)) if found else self.min_s
        return min(max(max_age, self.min_s), self.max_s)


def tls_context(ca_file: str = "") -> ssl.SSLContext:
    """The TLS context of directory fetches: certifi's authorities (as httpx's own), and ``ca_file``'s; raises
    ConfigError when that file holds none."""
    context = ssl.create_default_context(cafile=certifi.where())
    if ca_file:
        try:
            context.load_verify_locations(cafile=ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"verify.directory_ca_file {ca_file!r}: no certificate authority read ({exc}).") from None
    return context


class DirectoryError(ValueError):
    """A key directory that cannot be used, and why."""


def parse_directory(body: bytes) -> dict[str, PublishedKey]:
    """The Ed25519 keys of a JSON Web Key Set by their RFC 7638 thumbprint (keys of other types are skipped)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise DirectoryError(f"not JSON: {type(exc).__name__}") from None
    entries = data.get("keys") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise DirectoryError('no "keys" array')
    keys: dict[str, PublishedKey] = {}
    for entry in entries[: MAX_KEYS * 4]:
        if not isinstance(entry, dict) or entry.get("kty") != "OKP" or entry.get("crv") != "Ed25519":
            continue
        x = entry.get("x")
        raw = _unbase64url(x) if isinstance(x, str) else None
        if raw is None or len(raw) != 32:
            continue
        not_before, expires = entry.get("nbf", 0), entry.get("exp", 0)
        if not isinstance(not_before, int | float) or not isinstance(expires, int | float):
            continue
        keys[thumbprint(str(x))] = PublishedKey(Ed25519PublicKey.from_public_bytes(raw), not_before, expires)
        if len(keys) == MAX_KEYS:
            break
    if not keys:
        raise DirectoryError("no Ed25519 key")
    return keys


def thumbprint(x: str) -> str:
    """The RFC 7638 JWK thumbprint (SHA-256, base64url) of an Ed25519 public key given by its ``x``."""
    canonical = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": x}, separators=(",", ":"), sort_keys=True)
    return base64.urlsafe_b64encode(hashlib.sha256(canonical.encode()).digest()).rstrip(b"=").decode()


def _unbase64url(text: str) -> bytes | None:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
