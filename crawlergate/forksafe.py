"""What a forked child must not inherit: threads, locks and connections of its parent.

A pre-forking server (gunicorn ``--preload``) may fork after a gate started: the child has none of the
parent's threads, and a lock some parent thread held at the fork stays held in the child for ever. Objects
that own such things register a reset, called in every child they live in.

    after_fork_in_child(store, DiskStore.forget_parent)
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import TypeVar

Owner = TypeVar("Owner")


def after_fork_in_child(owner: Owner, reset: Callable[[Owner], None]) -> None:
    """Call ``reset(owner)`` in each forked child, as long as ``owner`` lives."""
    reference = weakref.ref(owner)

    def in_child() -> None:
        alive = reference()
        if alive is not None:
            reset(alive)

    os.register_at_fork(after_in_child=in_child)
