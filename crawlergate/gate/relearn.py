"""Telling a page catalogue begun anew which pages L2 holds.

The page catalogue (gate/catalogue.py) is how `regenerate --all`, `invalidate --pattern` and the off-peak job
find stored pages. When its file was damaged (set aside) or removed, it begins empty while L2 keeps its pages:
they would still be served, but found by none of these until filled again, so a page changed on the site could
be answered stale until it expires. Each page keeps the target it was stored for (page.py), so the folder is
read once, in the background, by one process, and its pages told to the new catalogue in batches; the catalogue
then remembers it was told (an interrupted pass is done again at the next start). Pages stored by versions that
did not keep the target cannot be told: they are counted and logged, and found again at their next fill.

    if not catalogue.knows_stored_pages():
        relearning = Relearning(cache.l2, catalogue)
        relearning.start()
        ...
        relearning.close()
"""

from __future__ import annotations

import fcntl
import logging
import threading
import time

from crawlergate.gate.catalogue import PageCatalogue
from crawlergate.page import stored_for
from crawlergate.stores.disk import DiskStore

logger = logging.getLogger(__name__)

# Pages told to the catalogue in one transaction.
BATCH_PAGES = 1000
# Held by the process telling the catalogue: the other workers leave the pass to it.
LOCK_FILE = ".relearn"


class Relearning:
    """A background pass over L2 that tells the catalogue its pages; ``learned`` counts those it did not know
    (not those stored since it began), ``unknown`` those stored without their target."""

    def __init__(self, l2: DiskStore, catalogue: PageCatalogue) -> None:
        self.l2 = l2
        self.catalogue = catalogue
        self.learned = 0
        self.unknown = 0
        self.done = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="crawlergate-relearn", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        try:
            with open(self.l2.root / LOCK_FILE, "a+b") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return  # another process tells it
                if not self.catalogue.knows_stored_pages():
                    self._tell()
        except OSError as exc:
            logger.warning("telling the page catalogue the pages stored in L2 failed: %s", exc)
        finally:
            self.done.set()

    def _tell(self) -> None:
        began = time.monotonic()
        batch: list[tuple[str, str, float]] = []
        for key, path in self.l2.stored_files():
            if self._stopping.is_set():
                return  # told again from the start at the next start
            try:
                stored = stored_for(path)
            except OSError:
                continue  # evicted or replaced since the listing: its store records it
            if stored is None:
                self.unknown += 1
                continue
            batch.append((key, *stored))
            if len(batch) >= BATCH_PAGES:
                self._record(batch)
                batch = []
        self._record(batch)
        self.catalogue.learned_stored_pages()
        if self.learned or self.unknown:
            unknown = (
                f"; {self.unknown:,} stored by an older version without their address stay unknown to regenerate "
                "and invalidate --pattern until filled again"
            )
            logger.warning(
                "the page catalogue %s did not know the pages stored in L2: %s told to it in %.1f s%s",
                self.catalogue.path,
                f"{self.learned:,}",
                time.monotonic() - began,
                unknown if self.unknown else "",
            )

    def _record(self, batch: list[tuple[str, str, float]]) -> None:
        self.learned += self.catalogue.learn_stored(batch)
