# SPDX-License-Identifier: Apache-2.0
"""Cold caches and the physical limit of the storage, measured in the same job.

*Cold cache*: every dataset file is evicted from the page cache with
``posix_fadvise(POSIX_FADV_DONTNEED)`` before each run (it cannot evict pages a process
still maps, so runners close their mappings first), and when a file lies on a mount of
the storage emulator its per-node caches are dropped as well.

*Physical limit*: what IOR or fio would report for these files through this path — all
ranks together read the data files with large sequential direct reads (``O_DIRECT``,
8 MiB blocks by default), each rank its contiguous share of the concatenated bytes. When
the file system refuses ``O_DIRECT`` the same reads are done buffered after an eviction.
Every result is then a fraction of this figure. The trade-off: the limit costs one extra
pass over the data per repeat, but it is measured on the same files, path, rank count
and moment as the runs it normalises.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from feedline.io.engine import evict as _evict
from feedline.plan.layout import floor_start

_ALIGN = 4096
DEFAULT_BLOCK = 8 << 20


def evict(paths: Iterable[str]) -> int:
    """Drop the cached pages of *paths* with :func:`feedline.io.evict` (written back
    first), passing over a file that cannot be opened or advised; return how many files
    were evicted."""
    n = 0
    for p in paths:
        try:
            _evict(p)
        except OSError:  # StorageError: gone, unreadable, or the advice refused
            continue
        n += 1
    return n


def fuse_mount_of(path: str) -> str | None:
    """The FUSE mount point that holds *path*, or None (reads ``/proc/self/mounts``)."""
    from feedline.io.profiles import mount_of

    m = mount_of(path, "fuse")
    return m[0] if m else None


class EmulatorMount:
    """The storage emulator (``feedline-fuse``) seen through its control files.

    The mount root holds ``.feedline-control`` (write ``drop`` to drop every node's
    page cache) and ``.feedline-stats`` (JSON: ``per_node`` and ``total`` counters).
    """

    CONTROL = ".feedline-control"
    STATS = ".feedline-stats"

    def __init__(self, mountpoint: str) -> None:
        self.mountpoint = mountpoint

    @classmethod
    def at(cls, mountpoint: str) -> EmulatorMount | None:
        """The emulator mounted at *mountpoint*, or None if it is another FUSE file system."""
        ok = os.path.exists(os.path.join(mountpoint, cls.CONTROL))
        return cls(mountpoint) if ok else None

    def drop_caches(self) -> None:
        with open(os.path.join(self.mountpoint, self.CONTROL), "w") as f:
            f.write("drop\n")

    def stats(self) -> dict[str, Any]:
        with open(os.path.join(self.mountpoint, self.STATS)) as f:
            return json.load(f)


def emulator_node(path: str) -> int | None:
    """The emulated node whose view *path* is in (``MNT/node<K>/...``), or None."""
    mnt = fuse_mount_of(path)
    if mnt is None:
        return None
    first = os.path.relpath(os.path.realpath(path), mnt).split(os.sep)[0]
    m = re.fullmatch(r"node(\d+)", first)
    return int(m.group(1)) if m else None


def emulator_for(path: str) -> Any:
    """The storage emulator serving *path* (an object with ``drop_caches()`` and
    ``stats()``), or None when *path* is not on an emulator mount.

    ``feedline_tools.emulate.Emulator.attach(mountpoint)`` is used when the emulator's Python
    API provides it; otherwise the mount's control files are driven directly.
    """
    mnt = fuse_mount_of(path)
    if mnt is None:
        return None
    direct = EmulatorMount.at(mnt)
    if direct is None:
        return None
    try:
        from feedline_tools.emulate import Emulator  # type: ignore[attr-defined]
    except ImportError:
        return direct
    attach = getattr(Emulator, "attach", None)
    if attach is None:
        return direct
    try:
        return attach(mnt)
    except Exception:
        return direct


def drop_caches(paths: Sequence[str]) -> dict[str, Any]:
    """Evict *paths* and drop the caches of any emulator serving them.

    Returns what was done: ``{"evicted": n, "emulators": m}``.
    """
    done = {"evicted": evict(paths), "emulators": 0}
    seen: set[int] = set()
    for p in paths:
        emu = emulator_for(p)
        if emu is not None and id(emu) not in seen:
            seen.add(id(emu))
            emu.drop_caches()
            done["emulators"] += 1
    return done


def share(total: int, rank: int, size: int, align: int = _ALIGN) -> tuple[int, int]:
    """Rank's contiguous byte share ``[lo, hi)`` of *total*, boundaries *align*-aligned."""
    units = -(-total // align)
    lo = floor_start(units, size, rank) * align
    hi = min(total, floor_start(units, size, rank + 1) * align)
    return min(lo, total), hi


@dataclass(frozen=True, slots=True)
class LimitResult:
    """One rank's part of a limit measurement."""

    bytes: int
    seconds: float
    ops: int
    method: str  # "odirect" or "buffered"


def _open(path: str, direct: bool) -> tuple[int, bool]:
    if direct and hasattr(os, "O_DIRECT"):
        try:
            return os.open(path, os.O_RDONLY | os.O_DIRECT), True
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
                raise
    return os.open(path, os.O_RDONLY), False


def read_share(
    files: Sequence[str], rank: int, size: int, *, block: int = DEFAULT_BLOCK, direct: bool = True
) -> LimitResult:
    """Read this rank's contiguous share of the concatenated *files* sequentially.

    Reads are *block* bytes into a page-aligned buffer, ``O_DIRECT`` when the file
    system accepts it. If a direct read fails with EINVAL (unaligned file system, FUSE
    without direct I/O) the files are evicted and the share is read buffered.
    """
    block = max(_ALIGN, block // _ALIGN * _ALIGN)
    sizes = [os.path.getsize(f) for f in files]
    lo, hi = share(sum(sizes), rank, size)
    buf = mmap.mmap(-1, block)  # anonymous mappings are page aligned, as O_DIRECT needs
    try:
        try:
            return _read_range(files, sizes, lo, hi, buf, direct)
        except OSError as e:
            if not direct or e.errno != errno.EINVAL:
                raise
        evict(files)
        return _read_range(files, sizes, lo, hi, buf, False)
    finally:
        buf.close()


def _read_range(files, sizes, lo, hi, buf, direct) -> LimitResult:
    view = memoryview(buf)
    nbytes = ops = 0
    used_direct = direct
    t0 = time.perf_counter()
    try:
        base = 0
        for path, fsize in zip(files, sizes, strict=True):
            a, b = max(lo, base) - base, min(hi, base + fsize) - base
            base += fsize
            if a >= b:
                continue
            fd, d = _open(path, direct)
            used_direct = used_direct and d
            try:
                # a direct read must start aligned; the share boundary is aligned in the
                # concatenation, so realign within this file and drop the extra bytes
                pos = a // _ALIGN * _ALIGN
                while pos < b:
                    got = os.preadv(fd, [view], pos)
                    ops += 1
                    if got <= 0:
                        break
                    nbytes += max(0, min(pos + got, b) - max(pos, a))
                    pos += got
            finally:
                os.close(fd)
    finally:
        view.release()
    return LimitResult(
        nbytes, time.perf_counter() - t0, ops, "odirect" if used_direct else "buffered"
    )
