# SPDX-License-Identifier: Apache-2.0
"""The three ways an LMDBIO reader brings the records of one step (LMDBIO journal §3-4.3).

- :class:`MmapCursor` — Caffe's reader: a liblmdb cursor over mmap (py-lmdb, read-only,
  ``lock=False``) stepped record by record; reaching a record means calling ``next``
  over every record before it (the *sequential seek*), and the value is copied out of
  the map (the page faults are the I/O). Used by ``lmdb``, ``lmm``, ``skip``,
  ``contiguous``.
- :class:`Speculative` — LMDBIO-DM: guess the byte range the coming records occupy
  from what earlier steps revealed (a linear record-to-offset model and its recent
  errors), prefetch it with ``pread`` on the engine's threads *before* the cursor
  arrives, then walk the tree in memory (:class:`~feedline.sources.lmdb_walk.PageWalker`)
  from the handed-over cursor. Pages the guess missed are read one by one.
- :class:`Locator` and :func:`read_extents` — LMDBIO-DIO: one process walks the tree to
  locate the records, and the readers ``pread`` the located extents on the engine
  (PROV/COAL read the index's extents with the engine directly).

Each reader writes records back to back into a destination buffer and counts seek and
I/O seconds, bytes and operations into a shared counters dict. The trade-off common to
all three: the reader is synchronous (one step at a time, as Caffe iterates); overlap
across steps is the coalescing presets' business.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import ConfigError, CorruptDataError, StorageError
from ..pipeline.reader import ExtentReader, ReadList
from .lmdb_walk import PageWalker, WalkCursor

_THREAD = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)


def new_counters() -> dict[str, Any]:
    """The per-rank counters every LMDBIO reader updates (see ``docs/lmdbio.md``)."""
    return {
        "seek_s": 0.0,
        "io_s": 0.0,
        "skew_s": 0.0,
        "sync_wait_s": 0.0,
        "handoff_wait_s": 0.0,
        "token_wait_s": 0.0,
        "locate_wait_s": 0.0,
        "seek_bytes": 0,
        "seek_ops": 0,
        "read_bytes": 0,
        "read_ops": 0,
        "records_read": 0,
        "payload_read_bytes": 0,
        "records_walked": 0,
        "major_faults": 0,
        "mmap_touched_bytes": 0,
        "spec_prefetch_bytes": 0,
        "spec_used_bytes": 0,
        "spec_miss_pages": 0,
        "spec_miss_bytes": 0,
        "located_records": 0,
    }


def _pread(fd: int, n: int, off: int, path: str) -> bytes:
    try:
        data = os.pread(fd, n, off)
    except OSError as e:
        raise StorageError(path, off, e.errno or 0) from e
    if len(data) != n:
        raise CorruptDataError(path, off + len(data), f"file ends inside a {n}-byte read")
    return data


# ----------------------------------------------------------------------- mmap cursor


class MmapCursor:
    """A liblmdb cursor (py-lmdb over mmap, read-only, no lock file) walked like Caffe's.

    ``storage_ops`` of this reader are the major page faults of the reading thread;
    ``mmap_touched_bytes`` estimates the pages the walk touched: the leaf pages passed
    (records walked / records per leaf, from ``env.stat()``) plus the overflow pages
    of every value copied. The kernel decides what it actually fetches (read-ahead).
    """

    def __init__(self, path: str, counters: dict[str, Any]) -> None:
        try:
            import lmdb
        except ImportError as e:  # pragma: no cover - lmdb is a dependency of the extras
            raise ConfigError("the liblmdb presets need py-lmdb (pip install lmdb)") from e
        from ..formats.lmdb import check_mappable
        from ..plan.lmdb_model import nodemax

        self.path = path
        self.c = counters
        self.env = None
        self._lmdb_error = lmdb.Error
        # liblmdb maps the file: a file shorter than its meta page says would SIGBUS.
        self.meta = check_mappable(path)
        with self._errors(0):
            self.env = lmdb.open(
                os.path.dirname(path), readonly=True, lock=False, readahead=True, subdir=True
            )
            st = self.env.stat()
            self.txn = self.env.begin(buffers=True)
            self.cur = self.txn.cursor()
        self.psize = int(st["psize"])
        self.entries = int(st["entries"])
        self.per_leaf = self.entries / max(1, int(st["leaf_pages"]))
        self.nodemax = nodemax(self.psize)
        self.pos = -1  # record under the cursor (-1: not positioned)

    @contextlib.contextmanager
    def _errors(self, record: int):
        """py-lmdb's errors (CorruptedError, PageNotFoundError, ...) as CorruptDataError."""
        try:
            yield
        except self._lmdb_error as e:
            raise CorruptDataError(
                self.path, 0, f"liblmdb near record {record}: {type(e).__name__}: {e}"
            ) from None

    def _seek(self, target: int) -> None:
        """Step the cursor to *target* with ``next`` calls (from the first key if behind)."""
        cur = self.cur
        if target < self.pos or self.pos < 0:
            if not cur.first():
                raise CorruptDataError(self.path, 0, "empty LMDB")
            self.pos = 0
            self.c["records_walked"] += 1
        steps = target - self.pos
        for k in range(steps):
            if not cur.next():
                raise CorruptDataError(
                    self.path,
                    0,
                    f"liblmdb's cursor ends at record {self.pos + k + 1}, "
                    f"but the database counts {self.entries} records",
                )
        self.pos = target
        self.c["records_walked"] += steps

    def read(self, ids: np.ndarray, dest: np.ndarray) -> np.ndarray:
        """Copy the values of *ids* (in order) back to back into *dest*; return lengths."""
        c = self.c
        lengths = np.zeros(len(ids), dtype=np.int64)
        f0 = resource.getrusage(_THREAD).ru_majflt
        from ..formats.lmdb import need_bytes

        need_bytes(self.path, self.meta)  # truncated since opened: raise, not SIGBUS
        with self._errors(int(ids[0]) if len(ids) else 0):
            seek_s, io_s, touched, pos = self._read(ids, dest, lengths)
        c["seek_s"] += seek_s
        c["io_s"] += io_s
        c["major_faults"] += resource.getrusage(_THREAD).ru_majflt - f0
        c["mmap_touched_bytes"] += touched
        c["records_read"] += len(ids)
        c["payload_read_bytes"] += pos
        return lengths

    def _read(self, ids: np.ndarray, dest: np.ndarray, lengths: np.ndarray):
        pos = 0
        touched = 0
        seek_s = io_s = 0.0
        for k, i in enumerate(ids.tolist()):
            if i >= self.entries:
                raise CorruptDataError(
                    self.path, 0, f"record {i} beyond the {self.entries} records"
                )
            if i != self.pos:
                t0 = time.perf_counter()
                self._seek(i)
                seek_s += time.perf_counter() - t0
            t0 = time.perf_counter()
            val = self.cur.value()
            n = len(val)
            dest[pos : pos + n] = np.frombuffer(val, dtype=np.uint8)
            if 8 + len(self.cur.key()) + n > self.nodemax:  # value in an overflow run
                touched += -(-(16 + n) // self.psize) * self.psize
            self.cur.next()
            io_s += time.perf_counter() - t0
            self.pos += 1
            self.c["records_walked"] += 1
            lengths[k] = n
            pos += n
        return seek_s, io_s, touched, pos

    def storage(self) -> tuple[int, int]:
        """(bytes, ops) asked of storage: touched pages (estimate) and major faults."""
        leaves = int(np.ceil(self.c["records_walked"] / max(self.per_leaf, 1.0)))
        return self.c["mmap_touched_bytes"] + leaves * self.psize, self.c["major_faults"]

    def close(self) -> None:
        env = getattr(self, "env", None)
        if env is not None:
            self.txn.abort()
            env.close()
            self.env = None


class PageCursor:
    """feedline's own cursor, for when py-lmdb cannot map the file: the same walk over
    the tree (:class:`Locator`'s page parser, one ``pread`` per page, as the map would
    fault them in), then the values read with the engine (:func:`read_extents`). Used
    by :func:`open_cursor` when this process already has the environment open in
    py-lmdb (liblmdb refuses a second open of one environment in a process)."""

    def __init__(self, path: str, counters: dict[str, Any], engine: ExtentReader) -> None:
        self.c = counters
        self.path = path
        self.engine = engine
        self.loc = Locator(path, counters)

    def read(self, ids: np.ndarray, dest: np.ndarray) -> np.ndarray:
        """Copy the values of *ids* (in order) back to back into *dest*; return lengths."""
        ids = np.asarray(ids, dtype=np.int64)
        u, offs, lens = self.loc.locate(ids)
        k = np.searchsorted(u, ids)
        offs, lens = offs[k], lens[k]
        read_extents(self.engine, offs, lens, dest, self.c)
        return lens

    def storage(self) -> tuple[int, int]:
        """(bytes, ops) beyond the counters: none (the engine counts its reads)."""
        return 0, 0

    def close(self) -> None:
        self.loc.close()


def open_cursor(
    path: str, counters: dict[str, Any], engine: Callable[[], ExtentReader]
) -> MmapCursor | PageCursor:
    """A liblmdb cursor over mmap, or :class:`PageCursor` (reading with ``engine()``)
    when liblmdb cannot open the environment because this process already has it open
    (a user's ``lmdb.open`` before the Loader): the same records, read with explicit
    reads; said once in the log."""
    try:
        return MmapCursor(path, counters)
    except Exception as e:
        if "already open" not in str(e):
            raise
    global _SAID_SHARED
    if not _SAID_SHARED:
        _SAID_SHARED = True
        logging.getLogger("feedline").info(
            "feedline: %s is already open in py-lmdb in this process; the cursor presets "
            "read it with feedline's own page reader instead of a second liblmdb map",
            path,
        )
    return PageCursor(path, counters, engine())


_SAID_SHARED = False


# --------------------------------------------------------------------- speculation


class Speculative:
    """LMDBIO-DM's reader: history-based speculative prefetch, in-memory cursor walk.

    The model: record r's value sits near ``ref_pos + slope * (r - ref_rec)``, where
    ``slope`` is the mean bytes per record between the first and the latest record
    observed and ``ref`` the latest. Before any history it is the meta page's
    file size over entries. The prefetched range is the estimate for ``[a, b)`` widened
    by 1.25x the largest of the last four steps' prediction errors (the 95th percentile
    of each step's needed bytes, below and above), plus two pages; with no history by a
    quarter of the span. Pages outside the range
    are read one by one (misses) and counted.
    """

    HISTORY = 4
    COVER = 95  # percentile of needed bytes the prefetch range aims to cover

    def __init__(self, path: str, engine: ExtentReader, counters: dict[str, Any]) -> None:
        from ..formats.lmdb import LmdbFile

        lf = LmdbFile(path)
        m = lf.meta
        self.c = counters
        self.c["seek_bytes"] += lf.bytes_read
        self.c["seek_ops"] += lf.read_ops
        lf.close()
        self.path = path
        self.engine = engine
        self.psize = int(m["page_size"])
        self.entries = int(m["main_db"]["entries"])
        self.file_bytes = int(m["file_bytes"])
        self.fd = os.open(path, os.O_RDONLY)
        self.walker = PageWalker(
            path,
            root=int(m["main_db"]["root"]),
            page_size=self.psize,
            entries=self.entries,
            fetch=self._fetch,
        )
        self.slope = self.file_bytes / max(1, self.entries)
        self.ref_rec, self.ref_pos = 0, 2 * self.psize
        self.first_obs: tuple[int, int] | None = None
        self.errs: deque[tuple[float, float]] = deque(maxlen=self.HISTORY)
        self.lo = self.hi = 0
        self.buf = np.zeros(0, dtype=np.uint8)
        self.future: Any = None

    # -- speculation
    def estimate(self, a: int, b: int) -> tuple[int, int]:
        """Byte range ``[lo, hi)`` (page aligned) guessed for records ``[a, b)``."""
        ea = self.ref_pos + self.slope * (a - self.ref_rec)
        eb = self.ref_pos + self.slope * (b - self.ref_rec)
        if self.errs:
            m_lo = 1.25 * max(e[0] for e in self.errs) + 2 * self.psize
            m_hi = 1.25 * max(e[1] for e in self.errs) + 2 * self.psize
        else:
            m_lo = m_hi = 0.25 * max(eb - ea, 0.0) + 8 * self.psize
        ps = self.psize
        lo = max(0, int((ea - m_lo) // ps) * ps)
        hi = min(self.file_bytes, int(-(-(eb + m_hi) // ps)) * ps)
        return lo, max(lo, hi)

    def prefetch(self, a: int, b: int) -> None:
        """Start reading the guessed range of ``[a, b)`` (returns at once)."""
        self.wait()
        lo, hi = self.estimate(a, b)
        self.lo, self.hi = lo, hi
        self.buf = np.empty(hi - lo, dtype=np.uint8)
        self.c["spec_prefetch_bytes"] += hi - lo
        z = np.zeros(1, dtype=np.int64)
        rl = ReadList(z, np.array([lo], dtype=np.int64), np.array([hi - lo], dtype=np.int64), z)
        self.future = self.engine.submit(rl, self.buf) if hi > lo else None

    def wait(self) -> None:
        if self.future is not None:
            t0 = time.perf_counter()
            f, self.future = self.future, None
            f.result()
            self.c["io_s"] += time.perf_counter() - t0

    def _inside(self, off: int, n: int) -> bool:
        return self.lo <= off and off + n <= self.hi

    def _fetch(self, pgno: int):
        off = pgno * self.psize
        if self._inside(off, self.psize):
            self.wait()
            return self.buf[off - self.lo : off - self.lo + self.psize]
        self.c["spec_miss_pages"] += 1
        self.c["spec_miss_bytes"] += self.psize
        self.c["seek_bytes"] += self.psize
        self.c["seek_ops"] += 1
        return _pread(self.fd, self.psize, off, self.path)

    # -- the walk
    def seek(
        self, cursor: WalkCursor | None, ids: np.ndarray
    ) -> tuple[WalkCursor, tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
        """Walk in memory from *cursor* over the records *ids* (ascending, consecutive).

        Returns the cursor after the last record (to hand to the next reader at once)
        and what :meth:`copy` needs. A missing or passed cursor restarts at the root.
        """
        n = len(ids)
        a = int(ids[0])
        if n > 1 and not (np.diff(ids) == 1).all():
            raise ConfigError(
                "lmm-dm hands cursors between readers and needs each reader's records of a "
                "step to be consecutive (the strided assignment)"
            )
        self.wait()  # the prefetch (I/O time), so that seek time is the walk alone
        t0 = time.perf_counter()
        if cursor is None or cursor.record > a:
            cursor = self.walker.first()
        skipped = a - cursor.record
        cursor, _, _ = self.walker.walk(cursor, skipped, collect=False)
        cursor, offs, lens = self.walker.walk(cursor, n)
        self.c["seek_s"] += time.perf_counter() - t0
        self.c["records_walked"] += skipped + n
        seen = np.asarray(self.walker.take_seen(), dtype=np.int64)
        return cursor, (a, offs, lens, seen)

    def copy(
        self, found: tuple[int, np.ndarray, np.ndarray, np.ndarray], dest: np.ndarray
    ) -> np.ndarray:
        """Copy the records :meth:`seek` found into *dest* (misses read one by one);
        learn from where they were. Returns their lengths."""
        c = self.c
        a, offs, lens, seen = found
        t0 = time.perf_counter()
        pos = 0
        for off, ln in zip(offs.tolist(), lens.tolist(), strict=True):
            if self._inside(off, ln):
                self.wait()
                dest[pos : pos + ln] = self.buf[off - self.lo : off - self.lo + ln]
            else:
                dest[pos : pos + ln] = np.frombuffer(_pread(self.fd, ln, off, self.path), np.uint8)
                pages = -(-(off + ln) // self.psize) - off // self.psize
                c["spec_miss_pages"] += pages
                c["spec_miss_bytes"] += ln
                c["read_bytes"] += ln
                c["read_ops"] += 1
            pos += ln
        c["io_s"] += time.perf_counter() - t0
        c["records_read"] += len(offs)
        c["payload_read_bytes"] += pos
        self._learn(a, offs, lens, seen)
        return lens

    def _learn(self, a: int, offs: np.ndarray, lens: np.ndarray, seen: np.ndarray) -> None:
        """Update the model with the positions this step revealed; count used bytes."""
        ps = self.psize
        recs = a + np.arange(len(offs), dtype=np.int64)
        est = self.ref_pos + self.slope * (recs - self.ref_rec)
        low = [est - offs]  # how far below / above its estimate each needed byte was
        high = [offs + lens - est]
        if len(seen):  # leaf and branch pages walked, against the span's estimate
            lo_e, hi_e = float(est.min(initial=self.ref_pos)), float(est.max(initial=self.ref_pos))
            low.append(lo_e - seen * ps)
            high.append(seen * ps + ps - hi_e)
        # a robust margin: the 95th percentile; the few pages LMDB's free list put far
        # away (reused pages of earlier commits) are read on demand instead
        below = float(np.percentile(np.concatenate(low), self.COVER)) if len(offs) else 0.0
        above = float(np.percentile(np.concatenate(high), self.COVER)) if len(offs) else 0.0
        below, above = max(below, 0.0), max(above, 0.0)
        self.errs.append((below, above))
        # bytes of the prefetch that were needed: value pages and walked pages inside it
        first, last = offs // ps, (offs + lens - 1) // ps
        pages = [seen] + [
            np.arange(f, g + 1) for f, g in zip(first.tolist(), last.tolist(), strict=True)
        ]
        need = np.unique(np.concatenate(pages)) if len(offs) or len(seen) else seen
        inside = (need * ps >= self.lo) & (need * ps + ps <= self.hi)
        self.c["spec_used_bytes"] += int(inside.sum()) * ps
        if len(offs):
            if self.first_obs is None:
                self.first_obs = (int(recs[0]), int(offs[0]))
            r0, p0 = self.first_obs
            self.ref_rec, self.ref_pos = int(recs[-1]), int(offs[-1])
            if self.ref_rec > r0:
                self.slope = (self.ref_pos - p0) / (self.ref_rec - r0)

    def storage(self) -> tuple[int, int]:
        return 0, 0  # the engine counts the prefetch; misses are in seek/read counters

    def close(self) -> None:
        self.wait()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


# ----------------------------------------------------------------------- locating


class Locator:
    """LMDBIO-DIO's single seeking process: walks the tree with the page parser, one
    ``pread`` per page (as mmap would fault them in), to find records' extents."""

    def __init__(self, path: str, counters: dict[str, Any]) -> None:
        from ..formats.lmdb import LmdbFile

        lf = LmdbFile(path)
        m = lf.meta
        counters["seek_bytes"] += lf.bytes_read
        counters["seek_ops"] += lf.read_ops
        lf.close()
        self.c = counters
        self.path = path
        self.psize = int(m["page_size"])
        self.fd = os.open(path, os.O_RDONLY)
        self.walker = PageWalker(
            path,
            root=int(m["main_db"]["root"]),
            page_size=self.psize,
            entries=int(m["main_db"]["entries"]),
            fetch=self._fetch,
        )
        self.cursor: WalkCursor | None = None

    def _fetch(self, pgno: int) -> bytes:
        self.c["seek_bytes"] += self.psize
        self.c["seek_ops"] += 1
        return _pread(self.fd, self.psize, pgno * self.psize, self.path)

    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Extents of the distinct *ids*: ``(sorted ids, offsets, lengths)``."""
        t0 = time.perf_counter()
        u = np.unique(np.asarray(ids, dtype=np.int64))
        offs = np.zeros(len(u), dtype=np.int64)
        lens = np.zeros(len(u), dtype=np.int64)
        if len(u):
            lo, hi = int(u[0]), int(u[-1]) + 1
            cur = self.cursor
            if cur is None or cur.record > lo:
                cur = self.walker.first()
            cur, _, _ = self.walker.walk(cur, lo - cur.record, collect=False)
            cur, o, ln = self.walker.walk(cur, hi - lo)
            self.cursor = cur
            offs[:] = o[u - lo]
            lens[:] = ln[u - lo]
            self.c["records_walked"] += hi - lo
        self.walker.take_seen()
        self.c["located_records"] += len(u)
        self.c["seek_s"] += time.perf_counter() - t0
        return u, offs, lens

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def read_extents(
    engine: ExtentReader,
    offs: np.ndarray,
    lens: np.ndarray,
    dest: np.ndarray,
    counters: dict[str, Any],
    file_ids: np.ndarray | None = None,
) -> None:
    """Read the extents back to back into *dest* with the engine (one read each)."""
    if not len(offs):
        return
    d = np.zeros(len(lens), dtype=np.int64)
    np.cumsum(lens[:-1], out=d[1:])
    fids = np.zeros(len(offs), dtype=np.int64) if file_ids is None else file_ids
    t0 = time.perf_counter()
    engine.read(ReadList(fids, offs, lens, d), dest)
    counters["io_s"] += time.perf_counter() - t0
    counters["records_read"] += len(offs)
    counters["payload_read_bytes"] += int(lens.sum())
