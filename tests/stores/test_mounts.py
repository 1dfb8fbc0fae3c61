"""Which file system holds a folder, read from the kernel's mount table."""

from __future__ import annotations

from pathlib import Path

from crawlergate.stores.mounts import IN_MEMORY, file_system_type

MOUNTINFO = """\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
25 22 0:21 / /dev/shm rw,relatime shared:2 - tmpfs tmpfs rw,size=65536k
31 22 0:30 / /var/lib/crawl\\040cache rw,relatime shared:5 - tmpfs tmpfs rw
40 22 0:40 / /srv rw,relatime shared:6 - nfs4 server:/export rw
41 40 0:41 / /srv/cache rw,relatime master:7 shared:8 - xfs /dev/vdb rw
45 22 0:45 / /srv/cache rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
not a mount line
"""


def test_the_deepest_mount_holding_the_folder_names_its_file_system() -> None:
    assert file_system_type(Path("/var/tmp/l2"), MOUNTINFO) == "ext4"
    assert file_system_type(Path("/dev/shm/crawlergate"), MOUNTINFO) == "tmpfs"
    assert file_system_type(Path("/dev/shmother"), MOUNTINFO) == "ext4"  # a prefix of the name is no parent
    assert file_system_type(Path("/srv/pages"), MOUNTINFO) == "nfs4"


def test_a_mount_point_with_a_space_and_a_later_mount_on_the_same_point() -> None:
    assert file_system_type(Path("/var/lib/crawl cache/sites"), MOUNTINFO) == "tmpfs"
    assert file_system_type(Path("/srv/cache/l2"), MOUNTINFO) == "overlay"  # the later mount hides the earlier


def test_an_unreadable_mount_table_names_no_file_system() -> None:
    assert file_system_type(Path("/var/tmp"), "") == ""


def test_the_running_systems_mount_table_is_read() -> None:
    assert file_system_type(Path("/")) != ""
    assert file_system_type(Path("/proc/self")) not in IN_MEMORY  # in memory, but not where pages are written
