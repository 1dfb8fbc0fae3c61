"""Which file system holds a folder, from the kernel's mount table (``/proc/self/mountinfo``).

L2 reads pages on the event loop when the kernel can say a read will not wait (``RWF_NOWAIT``); tmpfs and
ramfs cannot say, but hold every file in memory, so a read there never waits for a disk either.
"""

from __future__ import annotations

import os
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
# File systems whose files live in memory: a read of one never waits for a device (swap aside).
IN_MEMORY = frozenset({"tmpfs", "ramfs"})


def file_system_type(folder: Path, mountinfo: str | None = None) -> str:
    """The type of the file system ``folder`` lies on (``ext4``, ``tmpfs``, ``overlay``…); "" when the mount
    table cannot be read. ``mountinfo`` is the table's text (the running system's when None)."""
    if mountinfo is None:
        try:
            mountinfo = MOUNTINFO.read_text(errors="replace")
        except OSError:
            return ""
    where = os.path.realpath(folder)
    found, found_type = "", ""
    for line in mountinfo.splitlines():
        # "36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue" (proc(5)): the
        # mount point is the fifth field, the type the first after the lone "-"; spaces in paths come as \040.
        fields = line.split(" ")
        if len(fields) < 7 or "-" not in fields[6:]:
            continue
        mount_point = _unescaped(fields[4])
        if _holds(mount_point, where) and len(mount_point) >= len(found):
            found, found_type = mount_point, fields[fields.index("-", 6) + 1]
    return found_type


def _holds(mount_point: str, path: str) -> bool:
    return path == mount_point or path.startswith(mount_point.rstrip("/") + "/")


def _unescaped(field: str) -> str:
    """A mountinfo path: the kernel writes space, tab, newline and backslash as three octal digits."""
    if "\\" not in field:
        return field
    for code in ("040", "011", "012", "134"):
        field = field.replace("\\" + code, chr(int(code, 8)))
    return field
