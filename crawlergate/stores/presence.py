"""PresenceFilter: which pages L2 surely does not hold, known from memory shared by every process of a folder.

A crawler's miss used to hand its L2 lookup to a worker thread, to learn that no file is there: the hop
(a thread woken, the GIL passed back and forth, the loop woken) halved the misses the event loop could
serve. This is a Bloom filter of the folder's page keys, one byte a slot, in a file every process maps
(``l2.presence``): "surely absent" is answered from memory, "maybe present" still goes to the disk.

It is never wrong the unsafe way. Every write marks its page before the file appears (and again after, on
a filter renewed meanwhile); the loader, which lists the whole folder at start, renews the filter (a new
file, the old one flagged as superseded so that every process maps the new one) and marks it complete when
its listing ends; until then every key is "maybe". Deleted pages stay marked: the filter only grows less
useful until the next start renews it. One byte a slot, not a bit, so that processes marking at once never
undo each other's marks.

    presence = PresenceFilter(folder / PRESENCE_FILE, slots=max_bytes // 512)
    presence.open()
    marked = presence.add([digest]); os.replace(temp, page); presence.confirm([digest], marked)
    presence.may_have(digest)  # False: the page is surely not in the folder
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import struct
from collections.abc import Iterable

logger = logging.getLogger(__name__)

PRESENCE_FILE = "l2.presence"
_MAGIC = b"CGPF"
# magic, complete flag, superseded flag, two bytes unused, slot count
_HEADER = struct.Struct("<4sBBxxQ")
_COMPLETE = 4
_SUPERSEDED = 5
# Slots for each 4 KB the cap allows (a page takes one block at least): three marks a page keep "maybe" for
# an absent page under 3 % with the folder full of 4 KB pages, far less with real pages.
SLOTS_PER_BLOCK = 8
MIN_SLOTS = 1 << 16
MAX_SLOTS = 1 << 26


class PresenceFilter:
    """The folder's shared filter; ``may_have`` is True for every key until a full listing completed it."""

    def __init__(self, path: os.PathLike[str] | str, slots: int) -> None:
        self.path = os.fspath(path)
        self.slots_wanted = min(max(slots, MIN_SLOTS), MAX_SLOTS)
        # The mapped file and its slot count, replaced together (threads read them without a lock); a mapping
        # replaced is closed by the collector once no thread uses it.
        self._current: tuple[mmap.mmap, int] | None = None

    def open(self) -> None:
        """Map the folder's filter, made if there is none (it says "maybe" for every key until a load ends)."""
        self._remap()

    def close(self) -> None:
        self._current = None

    def may_have(self, key: str) -> bool:
        """False when the page of ``key`` (a hex digest) is surely not in the folder."""
        current = self._current
        if current is None:
            return True
        if current[0][_SUPERSEDED]:
            current = self._remap()
            if current is None:
                return True
        mapped, slots = current
        if not mapped[_COMPLETE]:
            return True
        try:
            hashed = int(key[:24], 16)
        except ValueError:  # not a digest (a store used by hand): never said to be absent
            return True
        return bool(
            mapped[_HEADER.size + hashed % slots]
            and mapped[_HEADER.size + (hashed >> 32) % slots]
            and mapped[_HEADER.size + (hashed >> 64) % slots]
        )

    def add(self, keys: Iterable[str]) -> object:
        """Mark pages about to appear in the folder (before their files are renamed into place); what was marked,
        for ``confirm``."""
        current = self._current
        if current is not None:
            for key in keys:
                _mark(current, key)
        return current

    def confirm(self, keys: list[str], marked: object) -> None:
        """After the pages' files appeared: a filter renewed since they were ``marked`` gets the marks too (its
        loader may have listed their shards before the files were there)."""
        current = self._current
        if current is not None and current[0][_SUPERSEDED]:
            current = self._remap()
        if current is not None and current is not marked:
            for key in keys:
                _mark(current, key)

    def renew(self) -> None:
        """The loader, before it lists the folder: a new, empty, incomplete filter for every process."""
        old = self._current
        self._write_new(replace=True)
        if old is not None:
            old[0][_SUPERSEDED] = 1
        self._remap()

    def complete(self) -> None:
        """The loader, after listing the whole folder into the filter it renewed: "surely absent" holds now."""
        current = self._current
        if current is not None and not current[0][_SUPERSEDED]:
            current[0][_COMPLETE] = 1

    def _write_new(self, *, replace: bool) -> None:
        temp = f"{self.path}.{os.getpid()}.tmp"
        with open(temp, "wb") as new:
            new.write(_HEADER.pack(_MAGIC, 0, 0, self.slots_wanted))
            new.flush()
            # Every block allocated now: a mark written into a hole of a sparse file on a full disk is a SIGBUS.
            os.posix_fallocate(new.fileno(), 0, _HEADER.size + self.slots_wanted)
        try:
            if replace:
                os.replace(temp, self.path)
            else:
                with contextlib.suppress(FileExistsError):  # another process made one first: that one is used
                    os.link(temp, self.path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)

    def _remap(self) -> tuple[mmap.mmap, int] | None:
        """Map the file at ``path`` now (a damaged or foreign one is replaced by a new one); None, and every key
        "maybe", when the file cannot be used."""
        current: tuple[mmap.mmap, int] | None = None
        try:
            for _ in range(2):
                try:
                    descriptor = os.open(self.path, os.O_RDWR)
                except FileNotFoundError:
                    self._write_new(replace=False)
                    continue
                try:
                    header = os.pread(descriptor, _HEADER.size, 0)
                    size = os.fstat(descriptor).st_size
                    if len(header) == _HEADER.size and header[:4] == _MAGIC:
                        slots = _HEADER.unpack(header)[3]
                        if slots > 0 and size == _HEADER.size + slots:
                            current = (mmap.mmap(descriptor, size), slots)
                            break
                finally:
                    os.close(descriptor)
                self._write_new(replace=True)
        except OSError as exc:
            logger.warning("L2 presence filter %s unusable (pages looked up on disk): %s", self.path, exc)
        self._current = current
        return current


def _mark(current: tuple[mmap.mmap, int], key: str) -> None:
    mapped, slots = current
    try:
        hashed = int(key[:24], 16)
    except ValueError:
        return
    mapped[_HEADER.size + hashed % slots] = 1
    mapped[_HEADER.size + (hashed >> 32) % slots] = 1
    mapped[_HEADER.size + (hashed >> 64) % slots] = 1
