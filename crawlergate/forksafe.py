"""What a forked child must not inherit: threads, locks and connections of its parent.

A pre-forking server (gunicorn ``--preload``) may fork after a gate started: the child has none of the
parent's threads, and a lock some parent thread held at the fork stays held in the child for ever. Objects
that own such things register a reset, called in every child they live in.

    after_fork_in_child(store, DiskStore.forget_parent)
"""

from __future__ import annotations

import os
import threading
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


def no_fork_inside(owner: Owner, lock_of: Callable[[Owner], threading.Lock]) -> None:
    """Fork only while no thread holds ``lock_of(owner)``: SQLite keeps the locks of a process's open files in
    its own memory, and a child forked in the middle of a parent thread's transaction inherits them held, by a
    connection nobody will ever close, so its own connections to the file wait for ever."""
    reference = weakref.ref(owner)
    held: list[threading.Lock] = []

    def before() -> None:
        alive = reference()
        if alive is not None:
            lock = lock_of(alive)
            lock.acquire()
            held.append(lock)

    def after() -> None:
        if held:
            held.pop().release()

    os.register_at_fork(before=before, after_in_parent=after, after_in_child=after)
