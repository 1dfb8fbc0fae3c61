"""DiskStore: L2, one file per page under a cache directory, written atomically, capped in size.

A page's file is named by its key digest in one level of 256 shard folders (``ab/abcd….page``),
never by anything from the URL. Writes go to a temporary file in the same folder, are fsynced,
then renamed over the old file, so a crash or a full disk never leaves half a page under the
page's name. The total size is capped, counted as the disk counts it (whole 4 KB blocks): the
least recently served pages go first. Recency is kept in memory and rebuilt from file times, so a
read costs no extra system call. Several processes share one directory (``serve --workers``): the
total is one count in the folder (``.size``), changed under a file lock by every write and delete
of every process, and a write that takes it past the cap evicts before the lock is let go, so the
folder never holds more than the cap and one page. Each process rescans the folder now and then
(``RESCAN_SECONDS``) to learn the recency of the others' pages. A full disk makes a write evict
pages and try once more instead of failing from then on. What else belongs to a page (its copy in
the published tree, stores/published.py) is counted in the same total (``alongside``, ``adjust``) and
goes with the page (``on_delete``, under the same lock).

    store = DiskStore(Path("/var/cache/crawlergate"), max_bytes=1 << 30)
    store.start()
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path

from crawlergate.errors import ConfigError, StoreUnavailable
from crawlergate.stores.owner import SITES_FOLDER

logger = logging.getLogger(__name__)

SUFFIX = ".page"
_TEMP_PREFIX = ".tmp-"
# The total size of the pages, shared by the processes that use the folder: 8 bytes, and its lock.
_COUNT_FILE = ".size"
# A temporary file older than this is a crashed write's: no write takes a minute.
_TEMP_STALE_SECONDS = 60.0
# What a file takes on disk: whole blocks of this size (ext4's and most file systems' default).
BLOCK_BYTES = 4096
# The folder of the published tree (stores/published.py): its files count against the cap too.
PUBLISHED_FOLDER = "published"
# How often a process recounts the directory, which other processes write to too.
RESCAN_SECONDS = 30.0
# On a full disk, a write first frees this share of the cache (or twice the page, if more).
ENOSPC_EVICT_SHARE = 0.1


class DiskStore:
    """Pages as files under ``root``; ``max_bytes`` caps their total size."""

    def __init__(
        self,
        root: Path,
        *,
        max_bytes: int,
        page_max_bytes: int = 8 * 1024 * 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.page_max_bytes = page_max_bytes
        self.used_bytes = 0
        self._recency: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()
        # The shared count: a thread of this process at a time (flock does not tell threads apart), then
        # a process at a time.
        self._count_lock = threading.Lock()
        self._count_fd = -1
        self._count_pid = 0
        self._clock = clock
        self._rescan_at = 0.0
        # Called once for each page deleted to stay within max_bytes (the cache counts them).
        self.on_evict: Callable[[], None] = _nothing
        # Called under the shared lock for each page deleted or evicted: drops what else belongs to the page (its
        # published copy) and returns the bytes that freed.
        self.on_delete: Callable[[str], int] = _no_twin

    def start(self) -> None:
        """Create the directory, drop temporary files a crash left behind, and index the pages."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f"{_TEMP_PREFIX}probe-{os.getpid()}-{threading.get_ident()}"
            probe.write_bytes(b"")
            probe.unlink()
            self._open_count()
        except OSError as exc:
            raise ConfigError(f"Cache directory '{self.root}' is not usable: {exc.strerror or exc}.") from None
        self._rescan(moving=True)

    def _rescan(self, *, moving: bool = False) -> None:
        """Count the pages on disk afresh (other processes write here too), then evict past the cap.

        Pages this process served keep their place in its recency order; the others go by file time.
        ``moving`` also moves pages of an older folder layout to their place and drops temporary files.
        """
        found: list[tuple[float, str, int]] = []
        published_bytes = 0
        published = os.path.join(self.root, PUBLISHED_FOLDER)
        # Other sites' default folders sit under the folder older versions shared: never counted (or moved) here.
        for path in walk_files(self.root, skip=os.path.join(self.root, SITES_FOLDER)):
            folder, name = os.path.split(path)
            if folder.startswith(published) and not name.startswith(_TEMP_PREFIX):
                with contextlib.suppress(OSError):
                    published_bytes += on_disk(os.lstat(path).st_size)
            elif name.startswith(_TEMP_PREFIX):
                # A crash's leftovers; not a write another process (a worker beside this one) has under way.
                with contextlib.suppress(OSError):
                    if moving and os.stat(path).st_mtime < time.time() - _TEMP_STALE_SECONDS:
                        os.unlink(path)
            elif name.endswith(SUFFIX):
                with contextlib.suppress(OSError):
                    key = name.removesuffix(SUFFIX)
                    if moving and Path(path) != self.path_for(key):
                        self.path_for(key).parent.mkdir(parents=True, exist_ok=True)
                        os.replace(path, self.path_for(key))
                    stat = os.stat(self.path_for(key))
                    found.append((stat.st_mtime, key, on_disk(stat.st_size)))
        found.sort()
        with self._lock:
            served = [key for key in self._recency]
            self._recency = OrderedDict((key, size) for _, key, size in found)
            for key in served:
                if key in self._recency:
                    self._recency.move_to_end(key)
            self._rescan_at = self._clock() + RESCAN_SECONDS
        with self._counted() as total:
            if moving:  # at start: the folder as it is, whatever a crash left in the count
                total[0] = sum(size for _, _, size in found) + published_bytes
            self._evict_past_cap(total)

    def __len__(self) -> int:
        return len(self._recency)

    def contains(self, key: str) -> bool:
        """Whether this process knows the page is on disk (its index; no system call)."""
        return key in self._recency

    def path_for(self, key: str) -> Path:
        return self.root / key[0:2] / (key + SUFFIX)

    def has_file(self, key: str) -> bool:
        """Whether the page's file is on disk now (asks the disk: another process may have written it)."""
        return self.path_for(key).exists()

    def alongside(self, key: str, work: Callable[[], int]) -> bool:
        """Run ``work`` under the shared lock if the page's file is there, counting the bytes it returns as added
        (and evicting past the cap, never this page); False when the page is gone."""
        with self._counted() as total:
            if not self.path_for(key).exists():
                return False
            total[0] += work()
            self._evict_past_cap(total, keep=key)
        return True

    def adjust(self, work: Callable[[], int]) -> None:
        """Run ``work`` under the shared lock, counting the bytes it returns as added (negative: freed)."""
        with self._counted() as total:
            total[0] += work()

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
        try:
            self._write(key, value)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise StoreUnavailable(f"L2 write of {key}: {exc.strerror}") from exc
            # The disk is full (of our pages or of something else): make room, then try once more.
            self._free(max(int(self.used_bytes * ENOSPC_EVICT_SHARE), 2 * on_disk(len(value))))
            try:
                self._write(key, value)
            except OSError as again:
                raise StoreUnavailable(f"L2 write of {key}: {again.strerror}") from again
        if self._clock() >= self._rescan_at:
            self._rescan()

    def _write(self, key: str, value: bytes) -> None:
        """The page written to a temporary file and synced, then put in place and counted under the shared lock,
        evicting past the cap before the lock is let go."""
        path = self.path_for(key)
        temp = path.with_name(f"{_TEMP_PREFIX}{key}-{os.getpid()}-{threading.get_ident()}")
        size = on_disk(len(value))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(temp, "wb") as handle:
                handle.write(value)
                handle.flush()
                os.fsync(handle.fileno())
            with self._counted() as total:
                replaced = _size_of(path)
                os.replace(temp, path)
                total[0] += size - replaced
                with self._lock:
                    self._recency.pop(key, None)
                    self._recency[key] = size
                self._evict_past_cap(total, keep=key)
        except OSError:
            with contextlib.suppress(OSError):
                temp.unlink()
            raise

    def delete(self, key: str) -> None:
        try:
            with self._counted() as total:
                path = self.path_for(key)
                size = _size_of(path)
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                total[0] -= size + self.on_delete(key)
        except OSError as exc:
            raise StoreUnavailable(f"L2 delete of {key}: {exc.strerror}") from exc
        with self._lock:
            self._recency.pop(key, None)

    def digests(self) -> list[str]:
        with self._lock:
            return list(self._recency)

    def close(self) -> None:
        with self._count_lock:
            if self._count_fd >= 0:
                os.close(self._count_fd)
                self._count_fd = -1
                self._count_pid = 0

    def _open_count(self) -> None:
        if self._count_fd >= 0:
            os.close(self._count_fd)
        self.root.mkdir(parents=True, exist_ok=True)
        self._count_fd = os.open(self.root / _COUNT_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        self._count_pid = os.getpid()

    @contextlib.contextmanager
    def _counted(self) -> Iterator[list[int]]:
        """The shared total, as a one-item list to change, held under the lock of every process of the folder."""
        with self._count_lock:
            if self._count_pid != os.getpid():
                # Opened here, not in __init__: a store written to before start(), or a forked child (a pre-forking
                # server), whose inherited descriptor flock would not tell from its parent's.
                self._open_count()
            fd = self._count_fd
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                raw = os.pread(fd, 8, 0)
                total = [max(0, int.from_bytes(raw, "little", signed=True)) if len(raw) == 8 else 0]
                before = total[0]
                try:
                    yield total
                finally:
                    if total[0] != before:
                        os.pwrite(fd, max(0, total[0]).to_bytes(8, "little", signed=True), 0)
                    self.used_bytes = max(0, total[0])
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _evict_past_cap(self, total: list[int], keep: str = "") -> None:
        self._evict_down_to(total, self.max_bytes, keep)

    def _free(self, wanted_bytes: int) -> None:
        """Delete the least recently served pages until ``wanted_bytes`` are freed (a full disk)."""
        with self._counted() as total:
            self._evict_down_to(total, max(0, total[0] - wanted_bytes))

    def _page_on_disk(self, keep: str) -> str | None:
        """Some page in the folder other than ``keep`` (the shard folders from a random one on)."""
        start = random.randrange(256)
        for number in range(256):
            shard = self.root / f"{(start + number) % 256:02x}"
            with contextlib.suppress(OSError), os.scandir(shard) as entries:
                for entry in entries:
                    key = entry.name.removesuffix(SUFFIX)
                    if entry.name.endswith(SUFFIX) and key != keep:
                        return key
        return None

    def _evict_down_to(self, total: list[int], goal: int, keep: str = "") -> None:
        """Under the shared lock: delete the least recently served pages this process knows (but ``keep``) until
        the total is at most ``goal``."""
        while total[0] > goal:
            with self._lock:
                victim = next((key for key in self._recency if key != keep), None)
                if victim is not None:
                    self._recency.pop(victim)
            from_disk = victim is None
            if victim is None:
                # Only pages other processes wrote since this one last looked: one of them, from the disk.
                victim = self._page_on_disk(keep)
                if victim is None:
                    return
            path = self.path_for(victim)
            size = _size_of(path)
            try:
                path.unlink()
            except OSError:
                if from_disk:
                    return  # a page that cannot be deleted would be picked again and again
                continue
            total[0] -= size + self.on_delete(victim)
            self.on_evict()


def walk_files(root: Path, *, skip: str = "") -> Iterator[str]:
    """The files under ``root`` but not under the folder ``skip``, without recursion (a tree deeper than
    Python's stack must not stop a walk)."""
    folders = [str(root)]
    while folders:
        folder = folders.pop()
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.path != skip:
                        folders.append(entry.path)
                else:
                    yield entry.path


def on_disk(size: int) -> int:
    """What a file of ``size`` bytes takes on disk, as counted: whole blocks."""
    return -(-size // BLOCK_BYTES) * BLOCK_BYTES


def _size_of(path: Path) -> int:
    """What a page's file takes on disk, as counted; 0 when there is none."""
    try:
        return on_disk(os.stat(path).st_size)
    except FileNotFoundError:
        return 0


def _nothing() -> None:
    pass


def _no_twin(key: str) -> int:
    return 0
