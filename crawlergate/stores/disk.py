"""DiskStore: L2, one file per page under a cache directory, written atomically, capped in size.

A page's file is named by its key digest in one level of 256 shard folders (``ab/abcd….page``),
never by anything from the URL. Writes go to a temporary file in the same folder, then are renamed
over the old file, so a crash or a full disk never leaves half a page under the page's name. They are
not synced: a page a power cut cuts fails its checksum when read, and is fetched again. The total
size is capped, counted as the disk counts it (whole 4 KB blocks): the least recently used pages go
first. Sizes, recency and the total live in the folder's shared index (stores/l2index.py), changed
by every process that writes there (``serve --workers``, the regenerator), so the size is known
without listing the folder and eviction never lists it either. A write that takes the total past the
cap evicts before it lets the index go, so the folder holds no more than the cap and one page; a cap
lowered by much is reached by the housekeeper, in turns of EVICT_TURN_S that leave the index as long
to the writes waiting (which meanwhile only keep the folder from growing).

At start the housekeeper of one process per folder (the *loader*) lists the folder once, in the
background, shard by shard: it adds pages the index misses (an older version's, a crash between a
rename and its row), drops rows whose file is gone, moves pages of an older layout and removes a
crash's temporary files. The store serves meanwhile: a read needs no index. Hits are counted in
memory and written to the index every ``TOUCH_FLUSH_S``. A full disk makes a write evict pages and
try once more instead of failing from then on. What else belongs to a page (its copy in the
published tree, stores/published.py) is counted in the same total (``alongside``, ``adjust``) and goes
with the page (``on_delete``, in the same transaction).

    store = DiskStore(Path("/var/cache/crawlergate"), max_bytes=1 << 30)
    store.start()
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

from crawlergate.errors import ConfigError, StoreUnavailable
from crawlergate.forksafe import after_fork_in_child
from crawlergate.stores.l2index import IndexWrite, L2Index
from crawlergate.stores.mounts import IN_MEMORY, file_system_type
from crawlergate.stores.owner import MARKER_FILE, SITES_FOLDER
from crawlergate.throttle import Throttle

logger = logging.getLogger(__name__)

SUFFIX = ".page"
_TEMP_PREFIX = ".tmp-"
# The shared index of the folder's pages (stores/l2index.py).
INDEX_FILE = "l2.sqlite3"
# Held by the process whose housekeeper loads the folder: one loader at a time.
LOADER_LOCK_FILE = ".loader"
# The shard folders: the first two characters of a key.
SHARDS = tuple(f"{number:02x}" for number in range(256))
# A temporary file older than this is a crashed write's: no write takes a minute.
_TEMP_STALE_SECONDS = 60.0
# What a file takes on disk: whole blocks of this size (ext4's and most file systems' default).
BLOCK_BYTES = 4096
# The folder of the published tree (stores/published.py): its files count against the cap too.
PUBLISHED_FOLDER = "published"
# How often the housekeeper writes the hits counted in memory and looks at the total.
TOUCH_FLUSH_S = 2.0
# Pages a write evicts at most before it lets the index go; the housekeeper evicts the rest, as many a transaction.
EVICT_BATCH = 256
# The longest the housekeeper holds the index (the folder's lock) to evict, and then leaves it (and the disk) as
# long again to the writes and reads waiting: on a cold disk 256 deletions held it for over a second, and every
# fill and `stats` waited.
EVICT_TURN_S = 0.02
# The loader's pause between two shards, so it leaves the cores to the requests.
LOAD_PAUSE_S = 0.005
# On a full disk, a write first frees this share of the cache (or twice the page, if more).
ENOSPC_EVICT_SHARE = 0.1
# Free space (or a tenth of the disk, if less) below which a start whose index cannot be opened takes the disk for
# full: pages are removed, the oldest written first, until this much is free (the index's log needs room).
START_ROOM_BYTES = 16 * 1024 * 1024
START_ROOM_INODES = 64
# Seconds between two warnings of pages L2 could not write (a full disk fails every fill).
WRITE_WARNING_INTERVAL_S = 60.0
# How get_at_once reads a page on the event loop: the preadv flags, or THREAD_READS (it does not).
NOWAIT_READS = os.RWF_NOWAIT
MEMORY_READS = 0
THREAD_READS = -1


class DiskStore:
    """Pages as files under ``root``; ``max_bytes`` caps their total size."""

    def __init__(
        self,
        root: Path,
        *,
        max_bytes: int,
        page_max_bytes: int = 8 * 1024 * 1024,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = root
        self._root = str(root)
        self.max_bytes = max_bytes
        self.page_max_bytes = page_max_bytes
        self.index = L2Index(root / INDEX_FILE)
        self._clock = clock
        # Hits since the housekeeper last wrote them: key -> when (a dict assignment: no lock on the read path).
        self._used: dict[str, float] = {}
        # How the event loop may read a page (``get_at_once``): NOWAIT_READS when the file system answers a read
        # that must not wait (RWF_NOWAIT: ext4, xfs, btrfs), MEMORY_READS when its files live in memory (tmpfs,
        # which cannot say), THREAD_READS when neither (NFS, overlayfs): each read is a thread's.
        self._reads_at_once = NOWAIT_READS
        self._started_at = 0.0
        self._loaded = threading.Event()
        self._stopping = threading.Event()
        self._over_cap = threading.Event()
        self._housekeeper: threading.Thread | None = None
        self._housekeeper_lock = threading.Lock()
        self._running = False
        # Called once for each page deleted to stay within max_bytes (the cache counts them).
        self.on_evict: Callable[[], None] = _nothing
        # Called in the index's transaction for each page deleted or evicted: drops what else belongs to the page
        # (its published copy) and returns the bytes that freed.
        self.on_delete: Callable[[str], int] = _no_twin
        # Told the pages this process evicted or deleted (the page catalogue notes them, to drop their rows later).
        self.on_removed: Callable[[list[str]], None] = _nothing_removed
        # Called when a write makes a shard folder and finds no owner's marker (the folder was removed under the gate,
        # and made again by it or by something else): the marker goes back (stores/owner.py), or a gate of another
        # site could claim the folder this one fills.
        self.on_folder_made: Callable[[], None] = _nothing
        # Pages not written since the last warning of it, said once a minute at most.
        self._unwritten = 0
        self._write_warnings = Throttle(WRITE_WARNING_INTERVAL_S)
        after_fork_in_child(self, DiskStore._forget_parent)

    def start(self) -> None:
        """Create the directory and open its index, then load the folder in the background (see the module). On a
        full disk, the oldest pages make room first: a gate that cannot start leaves people without the site."""
        for attempt in (1, 2):
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                probe = self.root / f"{_TEMP_PREFIX}probe-{os.getpid()}-{threading.get_ident()}"
                probe.write_bytes(b"")
                probe.unlink()
                self.index.open()
                break
            except (OSError, StoreUnavailable) as exc:
                if attempt == 1 and _no_space(exc) and self._room_made_on_a_full_disk():
                    continue
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                raise ConfigError(f"Cache directory '{self.root}' is not usable: {reason}.") from None
        self._started_at = self._clock()
        self._loaded.clear()
        self._running = True
        self._start_housekeeper()

    def _room_made_on_a_full_disk(self) -> bool:
        """When the folder's disk is out of space or of inodes: remove pages, the oldest written first (their recency
        is in the index, which cannot open), until START_ROOM_BYTES (or a tenth of a small disk) and some inodes are
        free; whether any was. The loader drops their rows."""
        try:
            disk = os.statvfs(self.root)
        except OSError:
            return False
        wanted = min(START_ROOM_BYTES, disk.f_blocks * disk.f_frsize // 10)
        if self._room_enough(wanted):
            return False  # room enough: another fault, for the caller to name
        pages = []
        for shard in SHARDS:
            with contextlib.suppress(OSError), os.scandir(self.root / shard) as entries:
                pages += [(entry.stat().st_mtime, entry.path) for entry in entries if entry.name.endswith(SUFFIX)]
        pages.sort()
        removed = freed = 0
        for _, path in pages:
            if self._room_enough(wanted):
                break
            with contextlib.suppress(OSError):
                size = os.stat(path).st_blocks * 512
                os.unlink(path)
                freed += size
                removed += 1
        if removed:
            logger.warning(
                "the disk of L2 %s is full: removed %d pages (%.1f MB), the oldest written, to open its index",
                self.root, removed, freed / 1e6,
            )  # fmt: skip
        return removed > 0

    def _room_enough(self, wanted: int) -> bool:
        """Whether ``wanted`` bytes and START_ROOM_INODES inodes are free (file systems without inodes count none)."""
        try:
            room = os.statvfs(self.root)
        except OSError:
            return True
        inodes_free = room.f_favail >= START_ROOM_INODES or room.f_files == 0
        return room.f_bavail * room.f_frsize >= wanted and inodes_free

    def close(self) -> None:
        self._running = False
        self._stopping.set()
        if self._housekeeper is not None:
            self._housekeeper.join(timeout=5)
        self._housekeeper = None
        try:
            self._flush_used()
        except StoreUnavailable as exc:
            logger.warning("L2 hits not recorded at close: %s", exc)
        self.index.close()

    def _forget_parent(self) -> None:
        """In a forked child (a pre-forking server): no housekeeper yet (the first read or write starts one),
        and none of the parent's locks or hits."""
        self._used = {}
        self._loaded, self._stopping, self._over_cap = threading.Event(), threading.Event(), threading.Event()
        self._housekeeper, self._housekeeper_lock = None, threading.Lock()

    def wait_loaded(self, timeout: float) -> bool:
        """Whether the folder was loaded (by this process or another) within ``timeout`` seconds."""
        return self._loaded.wait(timeout)

    def __len__(self) -> int:
        return self.index.totals()[0]

    @property
    def used_bytes(self) -> int:
        return self.index.totals()[1]

    def loading(self) -> float | None:
        """How much of the folder the loader has read (0 to 1), or None when it is loaded."""
        return self.figures()[2]

    def figures(self) -> tuple[int, int, float | None]:
        """Pages, bytes counted and ``loading``, read at once."""
        pages, used_bytes, shards, _ = self.index.totals()
        return pages, used_bytes, None if shards <= 0 else 1 - shards / len(SHARDS)

    def path_for(self, key: str) -> Path:
        return self.root / key[0:2] / (key + SUFFIX)

    def _file(self, key: str) -> str:
        """``path_for`` as a string: no Path object on the read and write paths."""
        return f"{self._root}/{key[0:2]}/{key}{SUFFIX}"

    def has_file(self, key: str) -> bool:
        """Whether the page's file is on disk now (asks the disk: another process may have written it)."""
        return os.path.exists(self._file(key))

    def alongside(self, key: str, work: Callable[[], int]) -> bool:
        """Run ``work`` in the index's transaction if the page's file is there, counting the bytes it returns as
        added (and evicting past the cap, never this page); False when the page is gone."""
        with self.index.writing() as write:
            if not self.has_file(key):
                return False
            write.add_other(work())
            self._evict_past_cap(write, keep=key)
        return True

    def adjust(self, work: Callable[[], int]) -> None:
        """Run ``work`` in the index's transaction, counting the bytes it returns as added (negative: freed)."""
        with self.index.writing() as write:
            write.add_other(work())

    def get(self, key: str) -> bytes | None:
        try:
            with open(self._file(key), "rb") as page:
                data = page.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreUnavailable(f"L2 read of {key}: {exc.strerror}") from exc
        self._read(key)
        return data

    def get_at_once(self, key: str, most_bytes: int) -> bytes | None | Literal[False]:
        """``get`` without waiting for the disk, for an event loop: the page when the system holds its file in
        memory whole (a read of microseconds, as nginx reads its cache) and it is at most ``most_bytes``; None
        when there is no such page; False when reading it would wait (``get`` it in a thread)."""
        reads = self._reads_at_once
        if reads == THREAD_READS:
            return False if self.has_file(key) else None
        try:
            fd = os.open(self._file(key), os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError:
            return False  # the thread's read says what is wrong
        try:
            size = os.fstat(fd).st_size
            if size > most_bytes:
                return False
            data = bytearray(size)
            if os.preadv(fd, (data,), 0, reads) != size:
                return False  # a part of it is on the disk only
        except BlockingIOError:
            return False
        except OSError as exc:
            if exc.errno == errno.EOPNOTSUPP:  # a file system that cannot say: in memory (tmpfs), or threads
                self._reads_at_once = self._reads_where_nowait_fails()
            return False
        finally:
            os.close(fd)
        self._read(key)
        return bytes(data)

    def _reads_where_nowait_fails(self) -> int:
        kind = file_system_type(self.root)
        if kind in IN_MEMORY:
            return MEMORY_READS
        logger.warning(
            "L2 %s is on a file system (%s) that cannot say whether a read would wait for the disk: each L2 hit "
            "is read in a thread, at about 2.5 times the CPU. A folder on ext4, xfs or btrfs (a Docker volume, "
            "not the container's own layer) or on tmpfs is read at once.",
            self.root,
            kind or "of unknown type",
        )
        return THREAD_READS

    def _read(self, key: str) -> None:
        """Note a page read: its recency, for eviction."""
        self._used[key] = self._clock()
        if self._housekeeper is None:
            self._start_housekeeper()  # a forked child's first read

    def set(self, key: str, value: bytes) -> None:
        if self.set_many([(key, value)]) != [key] and len(value) <= self.page_max_bytes:
            raise StoreUnavailable(f"L2 write of {key} failed")

    def set_many(self, pages: list[tuple[str, bytes]]) -> list[str]:
        """Write pages: each to a temporary file, then all put in place and counted in one index transaction,
        which evicts past the cap before it ends; the keys written. A full disk makes room and tries once more.
        When the transaction fails, the files it renamed are deleted (a file without its row would be counted
        by nobody), and StoreUnavailable is raised; a page that could not be written is logged."""
        if self._housekeeper is None:
            self._start_housekeeper()  # a forked child's first write
        failed: OSError | None = None
        placed: list[str] = []
        ready: dict[str, tuple[str, int]] = {}  # key -> its temporary file and size, until put in place
        try:
            for key, value in pages:
                if len(value) > self.page_max_bytes:
                    continue
                try:
                    ready[key] = (self._write_temp(key, value), on_disk(len(value)))
                except OSError as exc:
                    failed = exc
            if ready:
                with self.index.writing() as write:
                    now = self._clock()
                    # Room first, page by page: a batch never takes the folder past the cap and one page. A folder
                    # over the cap already (a lowered cap) is the housekeeper's, in short turns: a batch only keeps
                    # it from growing.
                    ceiling = max(self.max_bytes, write.total_bytes())
                    for key, (temp, size) in list(ready.items()):
                        self._evict_past_cap(write, keep=key, room=size, ceiling=ceiling)
                        try:
                            self._place(write, temp, key, size)
                        except OSError as exc:
                            failed = exc
                            continue
                        del ready[key]
                        placed.append(key)
                        write.put(key, size, now)
        except StoreUnavailable:
            for key in placed:
                with contextlib.suppress(OSError):
                    os.unlink(self._file(key))
            raise
        finally:
            for temp, _ in ready.values():
                with contextlib.suppress(OSError):
                    os.unlink(temp)  # not put in place
        if failed is not None:
            self._warn_of_failed_writes(len(pages) - len(placed), failed)
        return placed

    def _warn_of_failed_writes(self, pages: int, error: OSError) -> None:
        """Say that pages were not written, once a minute at most: a disk that cannot take them fails every fill."""
        self._unwritten += pages
        if self._write_warnings.due():
            logger.warning("L2 write failed for %d page(s) since the last warning: %s", self._unwritten, error)
            self._unwritten = 0

    def _write_temp(self, key: str, value: bytes) -> str:
        """The page in a temporary file beside its place; a full disk makes room for one more try."""
        folder = f"{self._root}/{key[0:2]}"
        temp = f"{folder}/{_TEMP_PREFIX}{key}-{os.getpid()}-{threading.get_ident()}"
        for attempt in (1, 2):
            try:
                try:
                    handle = open(temp, "wb")  # noqa: SIM115 - closed below, whichever open made it
                except FileNotFoundError:  # the shard's first page, or the folder removed under the gate
                    os.makedirs(folder, exist_ok=True)
                    if not os.path.exists(f"{self._root}/{MARKER_FILE}"):  # whoever made the folder again
                        self.on_folder_made()
                    handle = open(temp, "wb")  # noqa: SIM115
                with handle:
                    handle.write(value)
                return temp
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
                if exc.errno != errno.ENOSPC or attempt == 2:
                    raise
                # The disk is full (of our pages or of something else): make room, then try once more.
                with self.index.writing() as write:
                    self._make_room(write, len(value), key)
        raise AssertionError("unreachable")  # pragma: no cover

    def _place(self, write: IndexWrite, temp: str, key: str, size: int) -> None:
        """Rename the temporary file over the page's (in the index's transaction); a full disk makes room."""
        try:
            os.replace(temp, self._file(key))
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            self._make_room(write, size, key)
            os.replace(temp, self._file(key))

    def _make_room(self, write: IndexWrite, size: int, keep: str) -> None:
        """Evict the least recently used pages, a share of the cache (or twice the page, if more): a full disk."""
        wanted = max(int(write.total_bytes() * ENOSPC_EVICT_SHARE), 2 * on_disk(size))
        self._evict_down_to(write, max(0, write.total_bytes() - wanted), keep, wanted // BLOCK_BYTES + 1)

    def delete(self, key: str) -> None:
        try:
            with self.index.writing() as write:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._file(key))
                write.remove(key)
                write.add_other(-self.on_delete(key))
        except OSError as exc:
            raise StoreUnavailable(f"L2 delete of {key}: {exc.strerror}") from exc
        self._used.pop(key, None)
        self.on_removed([key])

    def digests(self) -> list[str]:
        return self.index.keys()

    def stored_files(self) -> Iterator[tuple[str, str]]:
        """Each page file in the folder, (key, path), found by listing it: what the index may not know yet."""
        for shard in SHARDS:
            with contextlib.suppress(FileNotFoundError), os.scandir(self.root / shard) as entries:
                for entry in entries:
                    if entry.name.endswith(SUFFIX) and not entry.name.startswith(_TEMP_PREFIX):
                        yield entry.name.removesuffix(SUFFIX), entry.path

    def _evict_past_cap(self, write: IndexWrite, keep: str = "", room: int = 0, ceiling: int = 0) -> None:
        """Evict down to the cap, or ``ceiling`` if higher (less ``room`` bytes), at most EVICT_BATCH pages; the
        housekeeper goes on down to the cap if that was not enough."""
        goal = max(self.max_bytes, ceiling) - room
        if not self._evict_down_to(write, goal, keep, EVICT_BATCH) or goal + room > self.max_bytes:
            self._over_cap.set()

    def _evict_down_to(self, write: IndexWrite, goal: int, keep: str, most: int, until: float = float("inf")) -> bool:
        """In the index's transaction: delete the least recently used pages (but ``keep``), at most ``most`` and
        until ``until`` (time.monotonic; one page at least), until the total is at most ``goal``; whether it got
        there."""
        total = write.total_bytes()
        if total > goal:
            self._write_hits(write)
        evicted = 0
        while total > goal and evicted < most and (not evicted or time.monotonic() < until):
            victims = [row for row in write.least_recently_used(min(64, most - evicted) + 1) if row[0] != keep]
            if not victims:
                return True  # nothing left to evict but the page just written (or what is held beside pages)
            removed = []
            try:
                for victim, size in victims[: most - evicted]:
                    try:
                        os.unlink(self._file(victim))
                    except FileNotFoundError:
                        pass
                    except OSError as exc:
                        logger.warning("could not evict L2 page %s: %s", victim, exc.strerror)
                    removed.append(victim)
                    freed = self.on_delete(victim)
                    write.add_other(-freed)
                    self._used.pop(victim, None)
                    total -= size + freed
                    evicted += 1
                    self.on_evict()
                    if total <= goal or time.monotonic() >= until:
                        break
            finally:  # a failure past a deleted file (its published copy's) must not leave the file's row behind
                write.remove_many(removed)
                self.on_removed(removed)
        return total <= goal

    def _write_hits(self, write: IndexWrite) -> None:
        """This process's hits, once a transaction, before it evicts: its own recent pages are not taken for old
        ones (other processes' hits are at most TOUCH_FLUSH_S late). Once a page, a batch's writes paid for every
        hit since the page before, each an update of the recency order: a third of the writer's time."""
        if not write.hits_written:
            used, self._used = self._used, {}
            write.mark_used(used)
            write.hits_written = True

    # the housekeeper
    def _start_housekeeper(self) -> None:
        """Start the housekeeper of a started store, unless it runs (a closed store has none)."""
        with self._housekeeper_lock:
            if self._housekeeper is not None or not self._running:
                return
            self._stopping.clear()
            self._housekeeper = threading.Thread(target=self._housekeep, name="crawlergate-l2", daemon=True)
            self._housekeeper.start()

    def _housekeep(self) -> None:
        while True:
            try:
                if not self._loaded.is_set():
                    self._load_if_nobody_does()
                self._flush_used()
                while self._over_cap.is_set() and not self._stopping.is_set():
                    with self.index.writing() as write:
                        # The turn is the time it holds the index to evict: not its wait for it, nor the hits'
                        # writing (which took whole turns under a storm of hits, a page evicted each).
                        self._write_hits(write)
                        began = time.monotonic()
                        if self._evict_down_to(write, self.max_bytes, "", EVICT_BATCH, began + EVICT_TURN_S):
                            self._over_cap.clear()
                    time.sleep(max(LOAD_PAUSE_S, time.monotonic() - began))
                pages, used_bytes, _, loaded_at = self.index.totals()
                if pages and used_bytes > self.max_bytes:
                    self._over_cap.set()  # another process's write, a lowered cap, or the loader's finds
                if loaded_at == 0 and self._loaded.is_set():
                    # A new index (a damaged one was moved aside, by any process): the folder is loaded again.
                    self._loaded.clear()
                    self._started_at = self._clock()
            except Exception as exc:  # the housekeeper must go on: the next turn tries again
                logger.warning("L2 upkeep of %s failed (tried again in %.0f s): %s", self.root, TOUCH_FLUSH_S, exc)
            if self._stopping.wait(0 if self._over_cap.is_set() else TOUCH_FLUSH_S):
                return

    def _flush_used(self) -> None:
        used, self._used = self._used, {}
        if used:
            self.index.touch(used)

    def _load_if_nobody_does(self) -> None:
        """Load the folder unless another process is at it; done once a load ended after this store started."""
        if self.index.totals()[3] >= self._started_at:
            self._loaded.set()
            return
        with open(self.root / LOADER_LOCK_FILE, "a+b") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # another process loads: its end is seen at a later turn
            if self.index.totals()[3] >= self._started_at:
                self._loaded.set()
                return
            self._load()

    def _load(self) -> None:
        """List the folder once, shard by shard, each in a transaction of its own: the index and the files
        agree after it (see the module)."""
        began = time.monotonic()
        with self.index.writing() as write:
            write.set_loading(len(SHARDS))
        self._move_pages_of_older_layouts()
        for done, shard in enumerate(SHARDS, start=1):
            if self._stopping.is_set():
                with self.index.writing() as write:
                    write.set_loading(0)  # stopped: not loading any more (the next start loads again)
                return
            self._load_shard(shard, len(SHARDS) - done)
            time.sleep(LOAD_PAUSE_S)
        published = published_bytes(self.root / PUBLISHED_FOLDER)
        with self.index.writing() as write:
            # Publishes during the walk may be counted twice or not at all: off by a few pages, once per start.
            write.set_other(published)
            write.set_loading(0, loaded_at=self._clock())
        pages, total, _, _ = self.index.totals()
        logger.info(
            "L2 %s loaded in %.1f s: %s pages, %.1f MB", self.root, time.monotonic() - began, f"{pages:,}", total / 1e6
        )
        self._loaded.set()

    def _load_shard(self, shard: str, shards_left: int) -> None:
        """Reconcile one shard: listed outside any transaction (a slow disk never holds the folder's lock), then
        each difference checked again inside one, where no other process renames or deletes a page."""
        found: set[str] = set()
        stale = time.time() - _TEMP_STALE_SECONDS
        with contextlib.suppress(FileNotFoundError), os.scandir(self.root / shard) as entries:
            for entry in entries:
                name = entry.name
                if name.startswith(_TEMP_PREFIX):
                    with contextlib.suppress(OSError):
                        if entry.stat(follow_symlinks=False).st_mtime < stale:
                            os.unlink(entry.path)  # a crash's; not a write under way in a worker beside this one
                elif name.endswith(SUFFIX):
                    found.add(name.removesuffix(SUFFIX))
                elif entry.is_dir(follow_symlinks=False):
                    found.update(key for key in self._move_pages_under(entry.path) if key.startswith(shard))
        with self.index.writing() as write:
            indexed = write.keys_from(shard)
            write.remove_many([key for key in indexed - found if not os.path.exists(self._file(key))])
            new = []
            for key in found - indexed:
                with contextlib.suppress(OSError):
                    stat = os.stat(self._file(key))
                    new.append((key, on_disk(stat.st_size), stat.st_mtime))
            write.put_many(new)
            write.set_loading(shards_left)

    def _move_pages_of_older_layouts(self) -> None:
        """Pages at the top of the folder or in folders other than the shards (older versions' layouts)."""
        skipped = {PUBLISHED_FOLDER, SITES_FOLDER, *SHARDS}
        with os.scandir(self.root) as entries:
            for entry in entries:
                if entry.name.endswith(SUFFIX) and entry.is_file(follow_symlinks=False):
                    self._move_page(entry.path)
                elif entry.name not in skipped and entry.is_dir(follow_symlinks=False):
                    list(self._move_pages_under(entry.path))

    def _move_pages_under(self, folder: str) -> Iterator[str]:
        for path in walk_files(Path(folder)):
            if path.endswith(SUFFIX) and not os.path.basename(path).startswith(_TEMP_PREFIX):
                key = self._move_page(path)
                if key is not None:
                    yield key

    def _move_page(self, path: str) -> str | None:
        key = os.path.basename(path).removesuffix(SUFFIX)
        with contextlib.suppress(OSError):
            self.path_for(key).parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, self.path_for(key))
            return key
        return None


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


def published_bytes(folder: Path) -> int:
    """What the files of the published tree take on disk, as counted."""
    total = 0
    for path in walk_files(folder):
        if not os.path.basename(path).startswith(_TEMP_PREFIX):
            with contextlib.suppress(OSError):
                total += on_disk(os.lstat(path).st_size)
    return total


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


def _no_space(error: BaseException) -> bool:
    """Whether a failure to open the folder comes from a full disk: ENOSPC, or SQLite's "full" or its I/O error
    (what creating an index's shared-memory file on a full disk gives); never a lock, a permission, a damage."""
    cause = error.__cause__ or error
    if isinstance(cause, OSError):
        return cause.errno in (errno.ENOSPC, errno.EDQUOT)
    code = getattr(cause, "sqlite_errorcode", 0) & 0xFF
    return isinstance(cause, sqlite3.Error) and code in (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR)


def _nothing_removed(keys: list[str]) -> None:
    pass


def _no_twin(key: str) -> int:
    return 0
