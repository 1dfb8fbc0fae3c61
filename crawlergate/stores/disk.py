"""DiskStore: L2, one file per page under a cache directory, written atomically, capped in size.

A page's file is named by its key digest in two levels of shard folders (``ab/cd/abcd….page``),
never by anything from the URL. Writes go to a temporary file in the same folder, are fsynced,
then renamed over the old file, so a crash or a full disk never leaves half a page under the
page's name. The total size is capped: the least recently served pages go first. Recency is kept
in memory and rebuilt from file times at start, so a read costs no extra system call.

    store = DiskStore(Path("/var/cache/crawlergate"), max_bytes=1 << 30)
    store.start()
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path

from crawlergate.errors import ConfigError, StoreUnavailable

logger = logging.getLogger(__name__)

SUFFIX = ".page"
_TEMP_PREFIX = ".tmp-"


class DiskStore:
    """Pages as files under ``root``; ``max_bytes`` caps their total size."""

    def __init__(self, root: Path, *, max_bytes: int, page_max_bytes: int = 8 * 1024 * 1024) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.page_max_bytes = page_max_bytes
        self.used_bytes = 0
        self._recency: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def start(self) -> None:
        """Create the directory, drop temporary files a crash left behind, and index the pages."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f"{_TEMP_PREFIX}probe-{os.getpid()}-{threading.get_ident()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise ConfigError(f"Cache directory '{self.root}' is not usable: {exc.strerror or exc}.") from None
        found: list[tuple[float, str, int]] = []
        for folder, _, files in os.walk(self.root):
            for name in files:
                path = os.path.join(folder, name)
                if name.startswith(_TEMP_PREFIX):
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                elif name.endswith(SUFFIX):
                    with contextlib.suppress(OSError):
                        stat = os.stat(path)
                        found.append((stat.st_mtime, name.removesuffix(SUFFIX), stat.st_size))
        found.sort()
        with self._lock:
            for _, key, size in found:
                self._recency[key] = size
                self.used_bytes += size
        self._evict()

    def __len__(self) -> int:
        return len(self._recency)

    def contains(self, key: str) -> bool:
        """Whether this process knows the page is on disk (its index; no system call)."""
        return key in self._recency

    def path_for(self, key: str) -> Path:
        return self.root / key[0:2] / key[2:4] / (key + SUFFIX)

    def get(self, key: str) -> bytes | None:
        try:
            data = self.path_for(key).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreUnavailable(f"L2 read of {key}: {exc.strerror}") from exc
        with self._lock:
            if key in self._recency:
                self._recency.move_to_end(key)
        return data

    def set(self, key: str, value: bytes) -> None:
        if len(value) > self.page_max_bytes:
            return
        path = self.path_for(key)
        temp = path.with_name(f"{_TEMP_PREFIX}{key}-{os.getpid()}-{threading.get_ident()}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(temp, "wb") as handle:
                handle.write(value)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                temp.unlink()
            raise StoreUnavailable(f"L2 write of {key}: {exc.strerror}") from exc
        with self._lock:
            self.used_bytes += len(value) - self._recency.pop(key, 0)
            self._recency[key] = len(value)
        self._evict()

    def delete(self, key: str) -> None:
        try:
            self.path_for(key).unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StoreUnavailable(f"L2 delete of {key}: {exc.strerror}") from exc
        with self._lock:
            self.used_bytes -= self._recency.pop(key, 0)

    def digests(self) -> list[str]:
        with self._lock:
            return list(self._recency)

    def close(self) -> None:
        pass

    def _evict(self) -> None:
        while True:
            with self._lock:
                if self.used_bytes <= self.max_bytes or not self._recency:
                    return
                key, size = self._recency.popitem(last=False)
                self.used_bytes -= size
            with contextlib.suppress(OSError):
                self.path_for(key).unlink()
