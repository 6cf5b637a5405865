# SPDX-License-Identifier: Apache-2.0
"""The native I/O engine: a pool of C++ threads that reads lists of extents into buffers.

A submission is a list of extents (file, offset, length) and, for each, a destination
offset in one writable buffer (a numpy array, a ``bytearray``, an MPI shared-memory
window, or a raw address). The engine cuts extents longer than ``chunk_bytes`` into
chunks and groups small ones into tasks of about ``total / threads`` bytes, so one big
extent is read by every thread and thousands of small ones do not pay a queue operation
each; threads take tasks in submission order. Methods: buffered ``pread`` (kernel
read-ahead, page-cache copies), ``odirect`` (``O_DIRECT``: no page cache, reads rounded
out to the file system's alignment through bounce buffers, buffered fallback with the
same bytes where the file system refuses it) and ``mmap`` (``memcpy`` from a mapping:
the reactive-paging baseline of the LMDBIO paper). The GIL is released while submitting
and while waiting.

>>> with IOEngine(["/data/train.bin"], threads=4, method="odirect") as eng:
...     buf = np.empty(1 << 20, np.uint8)
...     stats = eng.read(([0, 0], [0, 4096], [512, 1000]), buf)
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from .. import _core, defaults
from ..errors import ConfigError

METHODS = ("pread", "odirect", "mmap", "pread-random")
_MiB = 1 << 20
_WAIT_SLICE_S = 0.05  # waits are sliced so that Ctrl-C reaches a blocked caller
#: the most a thread's bounce buffer holds (``kBounceBytes`` in io_engine.cpp, and a
#: block of alignment): an ``odirect`` read of an extent that is not block-aligned goes
#: through it, so a reader of unaligned extents holds this much per thread
BOUNCE_BYTES = (1 << 20) + 4096
_KEPT: list[tuple[Any, Any]] = []  # destinations of abandoned reads (IOEngine.abandon)


@dataclass(frozen=True)
class IOStats:
    """Counters of one submission, or of an engine since it was created.

    Attributes
    ----------
    bytes : int
        Payload bytes delivered into buffers.
    storage_bytes : int
        Bytes asked of storage (``O_DIRECT`` rounds each read out to the alignment; for
        ``mmap`` the bytes copied).
    bounced_bytes : int
        ``O_DIRECT`` bytes copied out of the engine's bounce buffer because the read was
        not aligned in the file or in the destination (0 when every read landed in
        place: read operations widened to whole blocks, ``plan.reads.align_op``).
    ops : int
        Read system calls issued, retries included (0 for ``mmap``: it pages on faults).
    extents, tasks : int
        Extents executed; tasks (chunks or runs of small extents) executed.
    retries : int
        Transient errors retried. For an engine, counted as they happen.
    minor_faults, major_faults : int
        Page faults taken by the I/O threads; major ones waited for storage (the cost of
        ``mmap``'s reactive paging).
    submissions : int
        Submissions finished (1 for a submission).
    busy_s : float
        Thread-seconds spent executing tasks.
    wall_s : float
        Seconds from submission to completion; for an engine, the time during which at
        least one submission was in flight.
    """

    bytes: int = 0
    storage_bytes: int = 0
    bounced_bytes: int = 0
    ops: int = 0
    extents: int = 0
    tasks: int = 0
    retries: int = 0
    minor_faults: int = 0
    major_faults: int = 0
    submissions: int = 0
    busy_s: float = 0.0
    wall_s: float = 0.0

    @classmethod
    def _from_native(cls, st: Any) -> IOStats:
        return cls(**{f.name: getattr(st, f.name) for f in fields(cls)})

    @property
    def MBps(self) -> float:
        """Payload bandwidth in 10^6 bytes per wall second (0 when nothing was timed)."""
        return self.bytes / self.wall_s / 1e6 if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The counters as a plain dict (for JSON)."""
        return asdict(self)

    def __add__(self, other: IOStats) -> IOStats:
        """Field-wise sum (wall times add up too: use for sequential work)."""
        return IOStats(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )


@dataclass(frozen=True, slots=True)
class RawBuffer:
    """A destination given by address, e.g. an MPI shared-memory window's base.

    Parameters
    ----------
    address : int
        First writable byte.
    nbytes : int
        Writable bytes from *address*.
    owner : object, optional
        Kept alive while a read into this buffer is in flight (e.g. the ``MPI.Win``).
    """

    address: int
    nbytes: int
    owner: Any = None


class Future:
    """Completion of one submission; :meth:`result` gives its :class:`IOStats`.

    Thread-safe. Holds the destination buffer alive until the read is done.
    """

    __slots__ = ("_impl", "_keep", "_release", "_stats")

    def __init__(self, impl: Any, keep: Any, release: Any = None) -> None:
        self._impl = impl
        self._keep = keep
        self._release = release  # tells the engine it may drop its reference to the buffer
        self._stats: IOStats | None = None  # the result, once converted (it never changes)

    def done(self) -> bool:
        """True once the read finished, failed or was cancelled by ``close()``."""
        return bool(self._impl.done())

    def wait(self, timeout: float | None = None) -> bool:
        """Wait (GIL released) at most *timeout* seconds, or forever; return :meth:`done`."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            left = (
                _WAIT_SLICE_S
                if deadline is None
                else min(_WAIT_SLICE_S, deadline - time.monotonic())
            )
            if self._impl.wait(max(0.0, left)):
                if self._release is not None:
                    self._release()
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def result(self, timeout: float | None = None) -> IOStats:
        """Wait, then return the statistics or raise the read's error.

        Raises
        ------
        TimeoutError
            *timeout* elapsed first.
        feedline.CorruptDataError
            An extent ends past the end of its file.
        feedline.StorageError
            An open or read failed persistently (after retries): file, offset, errno.
        RuntimeError
            The engine was closed before the read ran.
        """
        if self._stats is not None:  # a window's reads are asked for at every step
            return self._stats
        if not self.wait(timeout):
            raise TimeoutError(f"I/O not done after {timeout} s")
        self._stats = IOStats._from_native(self._impl.result())
        return self._stats

    def __repr__(self) -> str:
        return f"<feedline.io.Future {'done' if self.done() else 'pending'}>"


def extent_columns(extents: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(file_ids, offsets, lengths)`` from a 3-tuple of columns, an (n, 3) integer
    array, or an object with ``file_ids``, ``offsets`` and ``lengths`` attributes (an
    :class:`~feedline.index.Index`, a plan's read list)."""
    if all(hasattr(extents, a) for a in ("file_ids", "offsets", "lengths")):
        cols = (extents.file_ids, extents.offsets, extents.lengths)
    elif isinstance(extents, np.ndarray):
        if extents.ndim != 2 or extents.shape[1] != 3:
            raise ValueError(f"an extent array must have shape (n, 3), not {extents.shape}")
        cols = (extents[:, 0], extents[:, 1], extents[:, 2])
    elif isinstance(extents, Sequence) and len(extents) == 3:
        cols = tuple(extents)
    else:
        raise TypeError(
            "extents must be (file_ids, offsets, lengths), an (n, 3) array or an object "
            "with file_ids/offsets/lengths"
        )
    fid, off, ln = (np.asarray(c).reshape(-1) for c in cols)
    for name, c in (("file_ids", fid), ("offsets", off), ("lengths", ln)):
        if c.size and c.dtype.kind not in "iu":
            raise TypeError(f"{name} must be integers, not {c.dtype}")
    return fid, np.ascontiguousarray(off, np.int64), np.ascontiguousarray(ln, np.int64)


def _byte_view(buffer: Any) -> np.ndarray:
    """A flat writable uint8 view of *buffer* (no copy)."""
    if isinstance(buffer, np.ndarray):
        if not buffer.flags.c_contiguous:
            raise ValueError("the destination buffer must be C-contiguous")
        if not buffer.flags.writeable:
            raise ValueError("the destination buffer is read-only")
        return buffer.reshape(-1).view(np.uint8)
    mv = memoryview(buffer)
    if mv.readonly:
        raise ValueError("the destination buffer is read-only")
    if not mv.c_contiguous:
        raise ValueError("the destination buffer must be C-contiguous")
    return np.frombuffer(mv.cast("B"), dtype=np.uint8)


class IOEngine:
    """A pool of native I/O threads over a fixed list of files.

    Parameters
    ----------
    files : sequence of str or os.PathLike
        The file table; extents name files by position. Files are opened on first use,
        once, and closed by :meth:`close`.
    threads : int, optional
        I/O threads (default ``feedline.defaults`` ``io_threads``, ``FEEDLINE_IO_THREADS``).
    method : {"pread", "odirect", "mmap"}, optional
        How bytes are read (default ``io_method``, ``FEEDLINE_IO_METHOD``).
    chunk_bytes : int, optional
        Largest single read; longer extents are split and spread over the threads
        (default ``io_chunk_mib`` MiB, ``FEEDLINE_IO_CHUNK_MIB``).
    alignment : int, optional
        ``O_DIRECT`` alignment; 0 asks the file system (``statx``), 4096 when it does not
        say (default ``io_align``, ``FEEDLINE_IO_ALIGN``).
    retries : int, optional
        Retries of a transient error (EIO, ETIMEDOUT, ...) before
        :class:`~feedline.StorageError` (default ``io_retries``, ``FEEDLINE_IO_RETRIES``).
    retry_backoff_s : float, optional
        First pause before a retry; doubled each time (default ``io_retry_backoff_ms``,
        ``FEEDLINE_IO_RETRY_BACKOFF_MS`` = 1 ms: 1 + 2 + 4 ms over the 3 retries).
    stage : bool, optional
        ``odirect`` only: read every extent into the thread's own staging buffer (reads of
        at most 4 MiB, on transparent huge pages when the kernel grants them) and copy it
        to the destination. For destinations in shared memory of 4 KiB pages (a node
        window), where one large ``O_DIRECT`` read becomes a device or FUSE request per
        few hundred pages; the copies are counted in ``bounced_bytes``.

    Notes
    -----
    Thread-safe: any thread may submit, wait, read statistics or close. Each destination
    must stay untouched until its future is done (the engine keeps the buffer object
    alive until then). :meth:`close` cancels queued reads (their futures raise
    ``RuntimeError``), waits for running ones and closes the files.
    """

    def __init__(
        self,
        files: Sequence[str | os.PathLike[str]],
        threads: int | None = None,
        method: str | None = None,
        chunk_bytes: int | None = None,
        *,
        alignment: int | None = None,
        retries: int | None = None,
        retry_backoff_s: float | None = None,
        stage: bool = False,
    ) -> None:
        if isinstance(files, str | os.PathLike):
            raise TypeError("files must be a sequence of paths, not one path")
        self.files = [os.fspath(f) for f in files]
        threads = int(defaults.get("io_threads") if threads is None else threads)
        method = str(defaults.get("io_method") if method is None else method)
        if chunk_bytes is None:
            chunk_bytes = int(defaults.get("io_chunk_mib")) * _MiB
        alignment = int(defaults.get("io_align") if alignment is None else alignment)
        retries = int(defaults.get("io_retries") if retries is None else retries)
        if retry_backoff_s is None:
            retry_backoff_s = float(defaults.get("io_retry_backoff_ms")) * 1e-3
        if method not in METHODS:
            raise ConfigError(f"unknown I/O method {method!r}; expected one of {METHODS}")
        if threads < 1:
            raise ConfigError(f"an I/O engine needs at least one thread, not {threads}")
        if chunk_bytes < 4096:
            raise ConfigError(f"chunk_bytes must be at least 4096, not {chunk_bytes}")
        if alignment < 0 or alignment & (alignment - 1):
            raise ConfigError(f"alignment must be 0 or a power of two, not {alignment}")
        if retries < 0 or retry_backoff_s < 0:
            raise ConfigError("retries and retry_backoff_s must be >= 0")
        self._impl = _core._IOEngine(  # type: ignore[attr-defined]  # _core.pyi: stubgen omits _names
            self.files,
            threads,
            method,
            int(chunk_bytes),
            alignment,
            retries,
            int(retry_backoff_s * 1e6),
            bool(stage),
        )
        self._lock = threading.Lock()
        self._inflight: deque[tuple[Any, Any]] = deque()

    @property
    def method(self) -> str:
        """The read method."""
        return str(self._impl.method)

    @property
    def threads(self) -> int:
        """Number of I/O threads."""
        return int(self._impl.threads)

    @property
    def chunk_bytes(self) -> int:
        """Largest single read."""
        return int(self._impl.chunk_bytes)

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return bool(self._impl.closed)

    def submit(self, extents: Any, buffer: Any, dest_offsets: Any = None) -> Future:
        """Start reading *extents* into *buffer*; return at once.

        Parameters
        ----------
        extents : (file_ids, offsets, lengths), (n, 3) int array, or object with those columns
            Byte ranges of the engine's files.
        buffer : writable buffer or RawBuffer
            Destination: a numpy array (any dtype, C-contiguous), ``bytearray``, ``mmap``,
            MPI window memory, or a :class:`RawBuffer` address.
        dest_offsets : int array, optional
            Byte offset of each extent in *buffer*; default back to back in order.
            Destinations must not overlap.

        Returns
        -------
        Future

        Raises
        ------
        IndexError
            A file id outside the file table.
        ValueError
            A negative offset or length, an extent that overflows the buffer, a read-only
            buffer, or a closed engine.
        """
        fid, off, ln = extent_columns(extents)
        if fid.size and (int(fid.min()) < 0 or int(fid.max()) >= len(self.files)):
            bad = int(fid.min()) if int(fid.min()) < 0 else int(fid.max())
            raise IndexError(f"file_id {bad} outside the file table ({len(self.files)} files)")
        fid = np.ascontiguousarray(fid, np.int32)
        dest = (
            None
            if dest_offsets is None
            else np.ascontiguousarray(np.asarray(dest_offsets).reshape(-1), np.int64)
        )
        if isinstance(buffer, RawBuffer):
            impl = self._impl.submit_raw(
                fid, off, ln, int(buffer.address), int(buffer.nbytes), dest
            )
            keep: Any = buffer
        else:
            view = _byte_view(buffer)
            impl = self._impl.submit(fid, off, ln, view, dest)
            keep = (buffer, view)
        with self._lock:
            # Buffers of reads in flight stay referenced here even if the caller drops
            # the future: the threads write into them until the read is done.
            self._prune_locked()
            if not impl.done():
                self._inflight.append((impl, keep))
        return Future(impl, keep, self._prune)

    def _prune_locked(self) -> None:
        self._inflight = deque(x for x in self._inflight if not x[0].done())

    def _prune(self) -> None:
        with self._lock:
            self._prune_locked()

    def read(self, extents: Any, buffer: Any, dest_offsets: Any = None) -> IOStats:
        """:meth:`submit`, then wait: the read's :class:`IOStats` or its error."""
        return self.submit(extents, buffer, dest_offsets).result()

    def stats(self) -> IOStats:
        """Cumulative :class:`IOStats` of the engine."""
        self._prune()
        return IOStats._from_native(self._impl.stats())

    def file_mode(self, file_id: int) -> str:
        """How file *file_id* is read now: ``"unopened"``, ``"buffered"``, ``"direct"``,
        ``"fallback"`` (``O_DIRECT`` refused, read buffered) or ``"mapped"``."""
        return str(self._impl.file_mode(int(file_id)))

    def evict(self) -> None:
        """Drop the engine's files from the page cache (see :func:`evict`)."""
        self._impl.evict()

    def abandon(self) -> None:
        """Like :meth:`close` without waiting for running reads (a stalled file system):
        their threads finish in the background and keep writing their destinations,
        which stay referenced by this engine forever — never reuse them."""
        with self._lock:
            _KEPT.extend(self._inflight)  # the buffers outlive the engine object
        self._impl.abandon()

    def close(self) -> None:
        """Cancel queued reads, wait for running ones, join the threads, close the files."""
        self._impl.close()
        with self._lock:
            self._inflight.clear()

    def __enter__(self) -> IOEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.threads} threads"
        return f"<IOEngine {self.method} {len(self.files)} files, {state}>"


def evict(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> None:
    """Drop the cached pages of *paths* (``posix_fadvise(DONTNEED)`` after ``fdatasync``).

    Makes the next read cold. Pages some process maps stay resident: close LMDB
    environments and numpy memmaps first. Raises :class:`~feedline.StorageError` for a
    file that cannot be opened.
    """
    for p in [paths] if isinstance(paths, str | os.PathLike) else paths:
        _core.evict_page_cache(os.fspath(p))


def resident_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes of *path* in the page cache right now (``mincore``)."""
    return int(_core.resident_bytes(os.fspath(path)))


def aligned_empty(nbytes: int, align: int = 4096) -> np.ndarray:
    """An uninitialised uint8 array of *nbytes* whose first byte is *align*-aligned
    (so ``O_DIRECT`` reads land in it without a bounce copy)."""
    raw = np.empty(nbytes + align, np.uint8)
    skip = (-raw.ctypes.data) % align
    return raw[skip : skip + nbytes]


@dataclass(frozen=True, slots=True)
class BenchResult:
    """One :func:`bench_read` measurement."""

    path: str
    method: str
    mode: str  # how the file was actually read ("direct", "fallback", ...)
    block_bytes: int
    threads: int
    bytes: int
    seconds: float
    ops: int

    @property
    def MBps(self) -> float:
        """10^6 bytes per second."""
        return self.bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0

    @property
    def MiBps(self) -> float:
        """2^20 bytes per second (fio's MiB/s)."""
        return self.bytes / self.seconds / _MiB if self.seconds > 0 else 0.0


def bench_read(
    path: str | os.PathLike[str],
    block_bytes: int = 8 * _MiB,
    method: str = "odirect",
    *,
    threads: int = 1,
    depth: int = 2,
    evict_first: bool = True,
    max_bytes: int | None = None,
    offset: int = 0,
) -> BenchResult:
    """Read *path* sequentially in *block_bytes* reads and time it: the storage's
    "physical limit" as ``fio --rw=read --direct=1 --ioengine=psync`` or
    ``dd iflag=direct`` measure it.

    Each submission reads *threads* consecutive blocks (one per thread) into an aligned
    buffer; *depth* submissions are in flight (double buffering by default), so the
    device always has *threads* reads queued. With ``evict_first`` the file is dropped
    from the page cache before timing (needed for buffered methods to mean anything).

    Parameters
    ----------
    path : str or os.PathLike
        File to read.
    block_bytes : int
        Bytes per read system call (>= 4096).
    method : {"odirect", "pread", "mmap"}
        Engine method.
    threads, depth : int
        I/O threads; submissions in flight.
    evict_first : bool
        Evict the file from the page cache first.
    max_bytes : int, optional
        Read only *max_bytes* bytes (from *offset*).
    offset : int
        Where the read starts (rounded down to 4096 bytes): ``feedline probe`` reads a
        region it has not read before for each measurement, because a virtual disk's
        host may keep recently read blocks (docs/planner.md, "Storage profiles").

    Returns
    -------
    BenchResult
    """
    path = os.fspath(path)
    if block_bytes < 4096 or threads < 1 or depth < 1:
        raise ConfigError("bench_read needs block_bytes >= 4096, threads >= 1 and depth >= 1")
    if offset < 0:
        raise ConfigError("bench_read needs offset >= 0")
    size = os.path.getsize(path)
    start = min(int(offset) // 4096 * 4096, size)
    total = size - start if max_bytes is None else min(size - start, int(max_bytes))
    nblocks = math.ceil(total / block_bytes)
    buffers = [aligned_empty(threads * block_bytes) for _ in range(depth)]
    for b in buffers:
        b.fill(0)  # fault the pages in now, not inside the timed loop
    if evict_first:
        evict(path)
    zeros = np.zeros(threads, np.int32)
    pending: deque[Future] = deque()
    with IOEngine([path], threads=threads, method=method, chunk_bytes=block_bytes) as eng:
        t0 = time.perf_counter()
        for i, first in enumerate(range(0, nblocks, threads)):
            if len(pending) == depth:
                pending.popleft().result()  # frees the buffer the next submission reuses
            k = min(threads, nblocks - first)
            rel = np.arange(first, first + k, dtype=np.int64) * block_bytes
            offsets = start + rel
            lengths = np.minimum(block_bytes, total - rel)
            pending.append(eng.submit((zeros[:k], offsets, lengths), buffers[i % depth]))
        while pending:
            pending.popleft().result()
        seconds = time.perf_counter() - t0
        st = eng.stats()
        mode = eng.file_mode(0) if total else "unopened"
    return BenchResult(path, method, mode, block_bytes, threads, st.bytes, seconds, st.ops)


__all__ = [
    "METHODS",
    "BenchResult",
    "Future",
    "IOEngine",
    "IOStats",
    "RawBuffer",
    "aligned_empty",
    "bench_read",
    "evict",
    "extent_columns",
    "resident_bytes",
]
