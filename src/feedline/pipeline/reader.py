# SPDX-License-Identifier: Apache-2.0
"""Reading lists of extents into caller buffers, and gathering records out of them.

:class:`ExtentReader` runs them on the native engine (:mod:`feedline.io.engine`: C++
threads, ``pread``/``O_DIRECT``, retries of transient errors). :func:`coalesce` merges neighbouring extents into fewer, larger
reads (the trade: bytes in holes are read and thrown away); :func:`gather` copies
records out of the merged reads in delivery order.
"""

from __future__ import annotations

import functools
import os
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _core, defaults
from ..errors import ConfigError, StorageTimeoutError
from ..io.engine import BOUNCE_BYTES, IOEngine
from ..plan.extents import merge_extents


@dataclass(frozen=True, slots=True)
class ReadList:
    """Reads to issue: extents of files and where each lands in the destination buffer."""

    file_ids: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    dest: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.lengths.sum())

    def __len__(self) -> int:
        return len(self.offsets)


@dataclass(frozen=True, slots=True)
class Coalesced:
    """Merged reads plus, for each requested record, where it lies in the read buffer."""

    reads: ReadList
    src: np.ndarray  # byte position of record i (request order) in the read buffer
    lengths: np.ndarray  # record lengths, request order

    @property
    def buffer_bytes(self) -> int:
        return self.reads.nbytes


def coalesce(file_ids, offsets, lengths, *, gap: int, per_sample: bool = False) -> Coalesced:
    """Merge extents of the same file whose holes are at most *gap* bytes.

    Duplicated or overlapping extents are read once. With *per_sample* every record
    is its own read (TF's one read per sample). Reads are sorted by (file, offset).
    """
    fid = np.asarray(file_ids, dtype=np.int64)
    off = np.asarray(offsets, dtype=np.int64)
    ln = np.asarray(lengths, dtype=np.int64)
    n = len(off)
    if n == 0:
        z = np.zeros(0, dtype=np.int64)
        return Coalesced(ReadList(z, z, z, z), z, z)
    if per_sample:
        dest = np.zeros(n, dtype=np.int64)
        np.cumsum(ln[:-1], out=dest[1:])
        return Coalesced(ReadList(fid, off, ln, dest), dest.copy(), ln)
    order = np.lexsort((off, fid))
    f_s, o_s = fid[order], off[order]
    first, r_end, read_id = merge_extents(f_s, o_s, ln[order], gap)
    r_fid = f_s[first]
    r_off = o_s[first]
    r_len = r_end - r_off
    r_dest = np.zeros(len(first), dtype=np.int64)
    np.cumsum(r_len[:-1], out=r_dest[1:])
    src_sorted = r_dest[read_id] + (o_s - r_off[read_id])
    src = np.empty(n, dtype=np.int64)
    src[order] = src_sorted
    return Coalesced(ReadList(r_fid, r_off, r_len, r_dest), src, ln)


def gather(
    buf: np.ndarray, src: np.ndarray, lengths: np.ndarray, out: np.ndarray | None = None
) -> np.ndarray:
    """Concatenate records ``buf[src[i] : src[i] + lengths[i]]`` in order: one memcpy per
    record, natively (``_core.copy_records``: no temporary, the GIL released for large
    batches); IndexError naming a record outside *buf* or *out*."""
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    if out is None:
        out = np.empty(int(lengths.sum()), dtype=np.uint8)
    _core.copy_records(buf, np.ascontiguousarray(src, dtype=np.int64), lengths, out)
    return out


#: the block an ``odirect`` read is aligned to when FEEDLINE_IO_ALIGN does not say (a
#: multiple of every common logical block size: 512 B, 4 KiB)
DIRECT_BLOCK = 4096


#: the most an engine thread's staging buffer holds (``kStageBytes`` in io_engine.cpp)
STAGE_BYTES = 4 << 20


#: file systems on a local block device: there an ``O_DIRECT`` read is one request per few
#: hundred pages of its destination (the queue's ``max_segments``), so a read into 4 KiB
#: pages becomes several requests where one into huge pages stays one
_BLOCK_FS = ("ext4", "xfs", "btrfs")
_THP = "/sys/kernel/mm/transparent_hugepage/"


@functools.lru_cache(maxsize=8)
def _thp_mode(name: str) -> str:
    """The selected value of a transparent-huge-page setting ("" when unreadable; read
    once per process)."""
    try:
        with open(_THP + name) as f:
            text = f.read()
    except OSError:
        return ""
    return text[text.find("[") + 1 : text.find("]")] if "[" in text else text.strip()


@functools.lru_cache(maxsize=1)
def _shm_on_huge_pages() -> bool:
    """Whether /dev/shm (where MPI's shared windows live) gives huge pages unasked."""
    from ..io.profiles import mount_options

    mode = _thp_mode("shmem_enabled")
    if mode in ("force", "deny"):
        return mode == "force"
    return any(o in ("huge=always", "huge=within_size") for o in mount_options("/dev/shm"))


def stage_reads(files: list[str], method: str) -> bool:
    """Whether a node window's reads go through the engine's huge-page staging buffers
    (``IOEngine(stage=True)``; knob ``io_stage``, FEEDLINE_IO_STAGE = auto, on or off).

    ``auto`` stages ``odirect`` reads of files on a local block-device file system when
    shared memory is on 4 KiB pages and anonymous memory can have huge pages: a 2 MiB read
    into the window would be split into requests of ``max_segments`` pages (about 1 MiB on
    a virtio disk), while into a huge page it is one; the copy into the window costs less
    than the requests it saves (docs/io-engine.md). Not for FUSE or network file systems:
    their requests are cut by size (FUSE's ``max_pages``, an RPC), whatever the pages.
    """
    from ..plan.cost import fs_type

    knob = str(defaults.get("io_stage")).strip().lower()
    if knob not in ("auto", "on", "off", "1", "0"):
        raise ConfigError(f"io_stage must be auto, on or off, not {knob!r}")
    if method != "odirect" or knob in ("off", "0"):
        return False
    if knob in ("on", "1"):
        return True
    if not files or fs_type(os.path.dirname(os.path.abspath(files[0]))) not in _BLOCK_FS:
        return False
    return _thp_mode("enabled") not in ("never", "") and not _shm_on_huge_pages()


def direct_align(files: list[str], method: str, known: Any = None) -> tuple[int, Any]:
    """``(block, file sizes)`` for widening read operations to whole direct-I/O blocks
    (:func:`feedline.plan.reads.align_op`) when *method* is ``odirect``; ``(0, known)``
    otherwise or when a file's size cannot be read. *known*: the sizes from an earlier
    call (a source asks once, not at every pass: millions of files on a parallel file
    system are millions of metadata requests)."""

    if method != "odirect":
        return 0, known
    if known is None:
        try:
            known = np.array([os.path.getsize(f) for f in files], dtype=np.int64)
        except OSError:
            return 0, None
    return int(defaults.get("io_align")) or DIRECT_BLOCK, known


class _Native:
    """The native engine (:class:`feedline.io.engine.IOEngine`): C++ threads,
    pread/O_DIRECT, retries of transient errors, typed errors from ``result()``."""

    def __init__(self, files: list[str], threads: int, method: str, stage: bool = False) -> None:
        self._impl = IOEngine(
            files,
            threads=threads,
            method=method,
            retry_backoff_s=float(defaults.get("io_retry_backoff_ms")) * 1e-3,
            stage=stage,
        )
        self.threads = threads
        self.method = method
        self.stage = stage

    def abandon(self) -> None:
        self._impl.abandon()

    def submit(self, reads: ReadList, buf: np.ndarray) -> Any:
        return self._impl.submit(reads, buf, reads.dest)

    def stats(self) -> dict[str, Any]:
        st = self._impl.stats()
        return {
            "storage_bytes": int(st.storage_bytes),
            "bounced_bytes": int(st.bounced_bytes),
            "storage_ops": int(st.ops),
            "io_s": float(st.busy_s),
            "io_retries": int(st.retries),
            "engine": f"native-{self.method}" + ("-staged" if self.stage else ""),
            "io_threads": self.threads,
        }

    def close(self) -> None:
        self._impl.close()


class ExtentReader:
    """Executes :class:`ReadList` s into numpy buffers on a pool of I/O threads.

    Parameters
    ----------
    files : list of str
        Dataset files; extents name them by position.
    threads : int
        I/O threads.
    method : {"pread", "odirect", "mmap"}
        Read method of the native engine.
    shared : bool
        The destinations are shared memory (a node window): ``odirect`` reads then go
        through the engine's huge-page staging buffers when :func:`stage_reads` says so.

    Thread safety: ``submit`` may be called from any thread; statistics are totals
    over all submitted reads.
    """

    def __init__(
        self,
        files: list[str],
        threads: int,
        method: str = "pread",
        *,
        timeout_s: float = 0.0,
        shared: bool = False,
    ) -> None:
        self._impl: Any = None
        self.files = list(files)
        self.timeout_s = float(timeout_s or 0.0)
        self.abandoned: str | None = None  # why the reads were abandoned (a stall)
        self.staged = shared and stage_reads(self.files, method)
        self._impl = _Native(files, threads, method, self.staged)

    @staticmethod
    def stage_bytes(files: list[str], method: str) -> int:
        """The most each thread's staging buffer holds when a reader of *files* into
        shared memory stages (:func:`stage_reads`; 0 when it does not)."""
        return STAGE_BYTES if stage_reads(files, method) else 0

    @staticmethod
    def bounce_bytes(method: str, threads: int) -> int:
        """The most the engine's bounce buffers hold, all *threads* together, for reads
        of extents that are not block-aligned (``odirect`` only; 0 otherwise)."""
        return int(threads) * BOUNCE_BYTES if method == "odirect" else 0

    def submit(self, reads: ReadList, buf: np.ndarray) -> Any:
        """Start reading *reads* into *buf*; ``result()`` raises the typed error on failure,
        or :class:`~feedline.errors.StorageTimeoutError` after ``timeout_s``."""
        if len(reads) == 0:
            f: Future = Future()
            f.set_result(None)
            return f
        if int((reads.dest + reads.lengths).max()) > buf.nbytes:
            raise ValueError("read list overflows its destination buffer")
        if self.abandoned is not None:
            raise StorageTimeoutError(
                self.files[int(reads.file_ids[0])],
                int(reads.offsets[0]),
                self.timeout_s,
                f"this reader abandoned a stalled read: {self.abandoned}",
            )
        fut = self._impl.submit(reads, buf)
        if not self.timeout_s:
            return fut
        return _Bounded(self, fut, buf, self.files[int(reads.file_ids[0])], int(reads.offsets[0]))

    def read(self, reads: ReadList, buf: np.ndarray) -> None:
        """Blocking :meth:`submit`."""
        self.submit(reads, buf).result()

    def _abandon(self, fut: Any, buf: np.ndarray, why: str) -> None:
        """Give up on a stalled read: its threads finish in the background, the buffer is
        kept referenced forever (never reused), and every later submit raises."""
        self.abandoned = why
        _ABANDONED.append((fut, buf, self._impl))
        self._impl.abandon()

    def stats(self) -> dict[str, Any]:
        """``storage_bytes``, ``storage_ops``, ``io_s`` (busy thread-seconds), engine name."""
        st = self._impl.stats()
        return dict(st) if isinstance(st, dict) else dict(vars(st))

    def close(self) -> None:
        """Wait for reads in flight, then release threads and file descriptors (after an
        abandoned read: nothing; the stalled threads finish in the background)."""
        if self.abandoned is None:
            self._impl.close()


#: reads given up after timeout_s: (future, buffer, engine), kept so that nothing they
#: may still write is freed or reused (the stalled threads end when the storage answers)
_ABANDONED: list[tuple[Any, Any, Any]] = []


class _Bounded:
    """A read's future whose ``result()`` waits at most the reader's ``timeout_s``."""

    __slots__ = ("_buf", "_fut", "_off", "_path", "_reader", "_t0")

    def __init__(self, reader: ExtentReader, fut: Any, buf: Any, path: str, off: int) -> None:
        self._reader, self._fut, self._buf = reader, fut, buf
        self._path, self._off = path, off
        self._t0 = time.monotonic()

    def done(self) -> bool:
        return bool(self._fut.done())

    def result(self) -> Any:
        r = self._reader
        left = r.timeout_s - (time.monotonic() - self._t0)
        if self._fut.wait(max(left, 0.0)):
            return self._fut.result()
        err = StorageTimeoutError(self._path, self._off, r.timeout_s)
        r._abandon(self._fut, self._buf, str(err))
        raise err
