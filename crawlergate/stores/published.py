"""PublishedTree: stored pages laid out by URL, so a front server (nginx) answers crawlers from disk.

The paper's Apache sent crawlers pre-compressed files straight from disk; the dynamic application
never saw a cached crawler request. The L2 folder names pages by digest, which no web server can
find from a URL, so beside it the gate keeps a second tree, addressed by URL: the gzip body of each
fresh page a static server can answer as-is, at ``published/<host>/<path>.gz`` (a path ending in
``/`` at ``<path>/.index.gz``). Only plain paths are published (``PLAIN_PATH``: no escapes, no query,
no dot segments, no segment starting with a dot, no ``.gz`` name; at most ``MAX_DEPTH`` segments), so
the path nginx reads from a request is the page's key, letter for letter; the nginx include sends
every other request to the gate.

A page leaves the tree before anything else learns it changed (the gate unpublishes before it marks),
when it expires (a sweeper thread), and with its L2 copy (the disk store calls ``remove`` for each page
it deletes or evicts); folders left empty go with it. Each page has a link beside its L2 copy
(``ab/<digest>.pub``: where it is published, until when, and the time and size of its file, kept after
an unpublish so a copy published again never repeats nginx's ETag for other bytes), so any process
finds it from the digest. Writes go through directory descriptors opened without following symbolic
links, then a rename: a link planted in the tree leads nowhere, and nginx never reads half a page.
Files are 0644 and folders 0755 whatever the umask (nginx's user reads them). The published bytes
count against L2's cap.

    tree = PublishedTree(l2, host="forum.example")
    tree.publish(key, page)   # after the page is stored and known unmarked
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from crawlergate.keys import CacheKey, digest_of
from crawlergate.page import Page
from crawlergate.stores.disk import PUBLISHED_FOLDER, DiskStore, on_disk, walk_files

logger = logging.getLogger(__name__)

# A path nginx can map to a file by itself, equal to its cache key: plain characters, no segment starting
# with a dot (so no dot segments, and the tree's own dotfiles are never addressable), no query. The nginx
# include holds the same expression (a test checks they agree).
# A path ending in ".gz" is not plain either: nginx would send a published file itself, raw, for it.
PLAIN_PATH = r"^(?!.*\.gz/?$)(?:/[A-Za-z0-9_~!*+,:@=-][A-Za-z0-9._~!*+,:@=-]*)*/?$"
_PLAIN_PATH = re.compile(PLAIN_PATH)
# A path ending in "/" is published as this file in its folder (nginx's include rewrites to it).
INDEX_NAME = ".index"
SUFFIX = ".gz"
LINK_SUFFIX = ".pub"
_TEMP_PREFIX = ".tmp-"
# The one content type the include gives every published file.
CONTENT_TYPE = "text/html; charset=utf-8"
# A page is unpublished this long before it expires: the sweeper wakes once a second.
EXPIRY_MARGIN_S = 2.0
_SEGMENT_MAX_BYTES = 255
# Deeper or longer paths stay with the gate: real pages are far shallower, and a client must not be able to make
# the gate build folder trees thousands deep (or walk them).
MAX_DEPTH = 16
MAX_NAME_BYTES = 1024
_HOST = re.compile(r"[a-z0-9](?:[a-z0-9.-]{0,252}[a-z0-9])?")
_OPEN_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def drop_published(l2_root: Path) -> None:
    """Remove a tree and its links left from a run with ``front.publish`` on: with it off nobody keeps the tree
    current, and nginx must not go on answering from it. Called before L2 counts its folder."""
    tree = l2_root / PUBLISHED_FOLDER
    if not tree.exists():
        return
    shutil.rmtree(tree, ignore_errors=True)
    for link in l2_root.glob(f"??/*{LINK_SUFFIX}"):
        link.unlink(missing_ok=True)


def host_folder(site_url: str) -> str:
    """The folder of a site's published pages: the host name of its public URL (or origin), without a port."""
    host = (urlsplit(site_url).hostname or "") if site_url else ""
    host = host.replace(":", "-")
    return host if _HOST.fullmatch(host) and ".." not in host else "default"


def published_name(target: str) -> str | None:
    """The file, relative to a host's folder, that holds the page of ``target``; None when not publishable."""
    if not _PLAIN_PATH.fullmatch(target):
        return None
    name = target[1:] + INDEX_NAME if target.endswith("/") else target[1:]
    name += SUFFIX
    segments = name.split("/")
    if len(segments) > MAX_DEPTH or len(name) > MAX_NAME_BYTES:
        return None
    if any(len(segment.encode()) > _SEGMENT_MAX_BYTES for segment in segments):
        return None
    return name


def target_of(name: str) -> str:
    """The page target a published file's name (relative to its host folder) stands for."""
    name = name.removesuffix(SUFFIX)
    if name == INDEX_NAME or name.endswith("/" + INDEX_NAME):
        return "/" + name.removesuffix(INDEX_NAME)
    return "/" + name


def publishable(page: Page, now: float) -> bool:
    """Whether a static server can answer with this page as the gate would: a 200 HTML page in UTF-8 whose only
    kept header is a ``Vary: Accept-Encoding``, not about to expire."""
    if page.status != 200 or page.expires_at <= now + 2 * EXPIRY_MARGIN_S:
        return False
    if page.content_type.replace(" ", "").lower() != CONTENT_TYPE.replace(" ", ""):
        return False
    return all(name == "vary" and value.strip().lower() == "accept-encoding" for name, value in page.headers)


class PublishedTree:
    """The published pages of one host, beside the L2 store whose cap they count against.

    Parameters:
        l2: the disk store: its folder holds the tree (``published/<host>``) and the links.
        host: the site's public host name (its folder).
        clock: wall-clock time, as the pages' expiry.
    """

    def __init__(self, l2: DiskStore, *, host: str, clock: Callable[[], float] = time.time) -> None:
        self.l2 = l2
        self.host = host
        self.root = l2.root / PUBLISHED_FOLDER / host
        self.clock = clock
        self._due: list[tuple[float, str]] = []
        self._due_lock = threading.Lock()
        self._stopping = threading.Event()
        self._sweeper: threading.Thread | None = None
        l2.on_delete = self.remove

    def start(self, marked: Callable[[], Iterable[str]]) -> None:
        """Create the host's folder, then in the background drop what must not be served (a page marked, expired
        or gone from L2 while the gate was down: a crash between a mark and its unpublish) and watch expiries."""
        self.root.mkdir(parents=True, exist_ok=True)
        for folder in (self.root.parent, self.root):
            folder.chmod(0o755)  # nginx's user enters them, whatever the gate's umask
        self._stopping.clear()
        self._sweeper = threading.Thread(target=self._run, args=(marked,), name="crawlergate-published", daemon=True)
        self._sweeper.start()

    def close(self) -> None:
        self._stopping.set()
        if self._sweeper is not None:
            self._sweeper.join(timeout=5)
            self._sweeper = None

    def publish(self, key: CacheKey, page: Page) -> bool:
        """Put a stored page in the tree, if a static server can answer with it; True when it was published.

        The caller publishes only a page it stored and found unmarked, and unpublishes it when a mark came
        meanwhile (``unpublish`` after ``catalogue.marked_now``).
        """
        name = published_name(key.target)
        if name is None or not publishable(page, self.clock()):
            return False
        folder, _, file_name = name.rpartition("/")
        temp = f"{_TEMP_PREFIX}{key.digest}-{os.getpid()}-{threading.get_ident()}"
        try:
            directory = _open_folder(self.root, folder.split("/") if folder else [], create=True)
        except OSError:
            return False  # a name taken by a page's file, or a planted link: this page stays with the gate
        try:
            _write(directory, temp, page.body_gz, page.last_modified)
            place = functools.partial(self._place, key.digest, directory, temp, file_name, name, page)
            placed = self.l2.alongside(key.digest, place)
        except OSError as exc:
            logger.warning("could not publish %s: %s", key.target, exc)
            placed = False
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=directory)
            os.close(directory)
        if placed:
            with self._due_lock:
                heapq.heappush(self._due, (page.expires_at, key.digest))
        return placed

    def unpublish(self, digests: Iterable[str]) -> None:
        """Take pages out of the tree (a mark, a purge, expiry): nginx sends their next request to the gate. The
        link stays, with the validators the file had, so a copy published again never repeats an old ETag."""
        for digest in digests:
            self.l2.adjust(functools.partial(self._freed, digest))

    def _freed(self, digest: str) -> int:
        link = _read_link(self._link(digest))
        if link is None or not link.get("on"):
            return 0
        freed = self._remove_file(str(link.get("p", "")))
        _write_link(self._link(digest), {**link, "on": False, "x": 0})
        return -freed

    def remove(self, digest: str) -> int:
        """Delete a page's published file and link; the bytes freed (the disk store calls this as it deletes)."""
        path = self._link(digest)
        link = _read_link(path)
        if link is None:
            return 0
        freed = self._remove_file(str(link.get("p", ""))) if link.get("on") else 0
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return freed

    def _place(self, digest: str, directory: int, temp: str, file_name: str, name: str, page: Page) -> int:
        """Under L2's lock, with the page's L2 copy there: the link, then the file; the bytes added."""
        link = self._link(digest)
        dated = _distinct_validators(directory, temp, file_name, page, _read_link(link))
        _write_link(link, {"p": name, "x": page.expires_at, "on": True, "m": dated, "s": len(page.body_gz)})
        replaced = _blocks_at(directory, file_name)
        os.rename(temp, file_name, src_dir_fd=directory, dst_dir_fd=directory)
        return on_disk(len(page.body_gz)) - replaced

    def _remove_file(self, name: str) -> int:
        folder, _, file_name = name.rpartition("/")
        try:
            directory = _open_folder(self.root, folder.split("/") if folder else [], create=False)
        except OSError:
            return 0
        try:
            size = _blocks_at(directory, file_name)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(file_name, dir_fd=directory)
        finally:
            os.close(directory)
        self._prune(folder)
        return size

    def _prune(self, folder: str) -> None:
        """Remove the folders a page's removal left empty, deepest first (a publish racing in fails, and retries
        with the next fill)."""
        parts = folder.split("/") if folder else []
        while parts:
            try:
                parent = _open_folder(self.root, parts[:-1], create=False)
            except OSError:
                return
            try:
                os.rmdir(parts[-1], dir_fd=parent)
            except OSError:
                return  # not empty (or gone): the folders above are not empty either
            finally:
                os.close(parent)
            parts.pop()

    def _link(self, digest: str) -> Path:
        return self.l2.path_for(digest).with_suffix(LINK_SUFFIX)

    def _run(self, marked: Callable[[], Iterable[str]]) -> None:
        try:
            self.check(set(marked()))
        except Exception:  # the sweeper must keep running: a failed check only leaves work for the next start
            logger.exception("checking the published pages failed")
        while not self._stopping.wait(1.0):
            self.sweep()

    def check(self, marked: set[str]) -> None:
        """Drop published pages that are marked, expired or without their L2 copy, and files without a link."""
        now = self.clock()
        for shard in sorted(os.listdir(self.l2.root)) if self.l2.root.is_dir() else ():
            with contextlib.suppress(OSError), os.scandir(self.l2.root / shard) as entries:
                for entry in entries:
                    if not entry.name.endswith(LINK_SUFFIX) or entry.name.startswith(_TEMP_PREFIX):
                        continue
                    digest = entry.name.removesuffix(LINK_SUFFIX)
                    if not self.l2.has_file(digest):
                        self.l2.adjust(functools.partial(_negated, self.remove, digest))
                        continue
                    expires_at = _expiry(Path(entry.path))
                    if expires_at == float("inf"):
                        continue  # not published now
                    if digest in marked or expires_at <= now + EXPIRY_MARGIN_S:
                        self.unpublish([digest])
                    else:
                        with self._due_lock:
                            heapq.heappush(self._due, (expires_at, digest))
        for path in walk_files(self.root):
            file_name = os.path.basename(path)
            if file_name.startswith(_TEMP_PREFIX) or not file_name.endswith(SUFFIX):
                continue
            name = os.path.relpath(path, self.root)
            link = _read_link(self._link(digest_of(target_of(name))))
            if link is None or not link.get("on") or link.get("p") != name:
                self.l2.adjust(functools.partial(_negated, self._remove_file, name))

    def sweep(self) -> None:
        """Unpublish the pages whose lifetime ends within the margin (a page published again meanwhile stays)."""
        soon = self.clock() + EXPIRY_MARGIN_S
        while True:
            with self._due_lock:
                if not self._due or self._due[0][0] > soon:
                    return
                _, digest = heapq.heappop(self._due)
            expires_at = _expiry(self._link(digest))
            if expires_at == float("inf"):
                continue  # already gone
            if expires_at > soon:
                with self._due_lock:
                    heapq.heappush(self._due, (expires_at, digest))
            else:
                self.unpublish([digest])


def _negated(work: Callable[[str], int], name: str) -> int:
    return -work(name)


def _open_folder(root: Path, parts: list[str], *, create: bool) -> int:
    """A descriptor of ``root/parts…``, each step opened without following a symbolic link."""
    directory = os.open(root, _OPEN_DIRECTORY)
    try:
        for part in parts:
            made = False
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=directory)
                    made = True
            inner = os.open(part, _OPEN_DIRECTORY, dir_fd=directory)
            os.close(directory)
            directory = inner
            if made:
                os.fchmod(directory, 0o755)  # whatever the umask: nginx's user enters it
    except OSError:
        os.close(directory)
        raise
    return directory


def _write(directory: int, name: str, data: bytes, modified: float) -> None:
    """A new file in ``directory`` (never through a link), with the page's Last-Modified as its time."""
    handle = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=directory)
    try:
        os.fchmod(handle, 0o644)  # nginx's user reads it, whatever the gate's umask (systemd's is 0027)
        view = memoryview(data)
        while view:
            view = view[os.write(handle, view) :]
    finally:
        os.close(handle)
    os.utime(name, (modified, modified), dir_fd=directory, follow_symlinks=False)


def _distinct_validators(directory: int, temp: str, name: str, page: Page, link: dict[str, Any] | None) -> int:
    """The time to give a published copy, so that nginx's ETag (the file's time and size) never repeats for other
    bytes: the page's Last-Modified, unless the copy it follows (the file there, else the one the link remembers
    from before an unpublish) had that size and a time at or after it. Then the same bytes keep that time, and
    other bytes (a page the site changed but dated the same) get a second more."""
    dated = int(page.last_modified)
    size = len(page.body_gz)
    try:
        old = os.stat(name, dir_fd=directory, follow_symlinks=False)
        before: tuple[int, int] | None = (int(old.st_mtime), old.st_size)
    except FileNotFoundError:
        old = None
        before = (int(link.get("m", 0)), int(link.get("s", -1))) if link else None
    if before is None or before[0] < dated or before[1] != size:
        return dated
    same = False
    if old is not None:
        handle = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
        try:
            same = os.read(handle, size + 1) == page.body_gz
        finally:
            os.close(handle)
    dated = before[0] if same else before[0] + 1
    os.utime(temp, (dated, dated), dir_fd=directory, follow_symlinks=False)
    return dated


def _read_link(path: Path) -> dict[str, Any] | None:
    try:
        link = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return link if isinstance(link, dict) else {}


def _write_link(path: Path, link: dict[str, Any]) -> None:
    temp = path.with_name(f"{_TEMP_PREFIX}{path.stem}-{os.getpid()}-{threading.get_ident()}{LINK_SUFFIX}")
    temp.write_bytes(json.dumps(link).encode())
    os.replace(temp, path)


def _blocks_at(directory: int, name: str) -> int:
    try:
        return on_disk(os.stat(name, dir_fd=directory, follow_symlinks=False).st_size)
    except FileNotFoundError:
        return 0


def _expiry(link: Path) -> float:
    """When a published page expires: inf when it is not published (the link gone or off), 0 when the link
    cannot be read (dropped)."""
    found = _read_link(link)
    if found is None or found.get("on") is False:
        return float("inf")
    try:
        return float(found["x"])
    except (KeyError, TypeError, ValueError):
        return 0.0
