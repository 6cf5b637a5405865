"""Reading lists of extents into caller buffers, and gathering records out of them.

:class:`ExtentReader` uses the native engine (:mod:`feedline.io.engine`, C++ threads,
``pread``/``O_DIRECT``, retries) when it is built, and otherwise a pool of Python threads calling
``os.preadv`` (which releases the GIL), so the loader works — slower — before the
native core exists. :func:`coalesce` merges neighbouring extents into fewer, larger
reads (the trade: bytes in holes are read and thrown away); :func:`gather` copies
records out of the merged reads in delivery order.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import CorruptDataError, StorageError, StorageTimeoutError

_RETRIES = 3  # transient errors (EINTR, EAGAIN) are retried, then reported


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
    f_s, o_s, e_s = fid[order], off[order], off[order] + ln[order]
    # running end within each file: shifting each file by more than any end makes one
    # cumulative max per file, so overlapping and duplicated records join one read
    new_file = np.ones(n, dtype=bool)
    new_file[1:] = f_s[1:] != f_s[:-1]
    gap = min(int(gap), int(e_s.max()))  # a hole wider than any file changes nothing
    shift = f_s * (int(e_s.max()) + gap + 1)
    run_end = np.maximum.accumulate(e_s + shift) - shift
    starts = new_file.copy()
    starts[1:] |= o_s[1:] > run_end[:-1] + gap
    read_id = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    r_fid = f_s[first]
    r_off = o_s[first]
    last_idx = np.append(first[1:], n) - 1
    r_end = run_end[last_idx]
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
    """Concatenate records ``buf[src[i] : src[i] + lengths[i]]`` in order (one copy)."""
    total = int(lengths.sum())
    if out is None:
        out = np.empty(total, dtype=np.uint8)
    n = len(src)
    if n == 0:
        return out
    L = int(lengths[0])
    if L > 0 and bool((lengths == L).all()):
        # fixed-size records: one fancy-indexing copy of (n, L) rows
        if bool((src % L == 0).all()) and buf.size % L == 0:
            out.reshape(n, L)[...] = buf.reshape(-1, L)[src // L]
            return out
        # rows of L bytes at arbitrary offsets: one copy through a strided view
        rows = np.lib.stride_tricks.sliding_window_view(buf[: int(src.max()) + L], L)
        out.reshape(n, L)[...] = rows[src]
        return out
    pos = 0
    for s, ln in zip(src.tolist(), lengths.tolist(), strict=True):
        out[pos : pos + ln] = buf[s : s + ln]
        pos += ln
    return out


class _PreadPool:
    """Fallback engine: Python threads issuing ``os.preadv`` (GIL released in the call)."""

    def __init__(self, files: list[str], threads: int, method: str) -> None:
        self.files = list(files)
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="feedline-pool")
        self.threads = threads
        self._stats = {"storage_bytes": 0, "storage_ops": 0, "io_s": 0.0}

    def _fd(self, fid: int) -> int:
        with self._lock:
            fd = self._fds.get(fid)
            if fd is None:
                fd = self._fds[fid] = os.open(self.files[fid], os.O_RDONLY)
            return fd

    def _read_one(self, mv: memoryview, fid: int, off: int, ln: int, dst: int) -> tuple[int, float]:
        t0 = time.perf_counter()
        path = self.files[fid]
        try:
            fd = self._fd(fid)
        except OSError as e:
            raise StorageError(path, off, e.errno or 0) from e
        done = 0
        tries = 0
        ops = 0
        while done < ln:
            try:
                got = os.preadv(fd, [mv[dst + done : dst + ln]], off + done)
            except InterruptedError:
                continue
            except OSError as e:
                tries += 1
                if tries < _RETRIES and e.errno in (11,):  # EAGAIN: transient
                    time.sleep(0.001 * tries)
                    continue
                raise StorageError(path, off + done, e.errno or 0) from e
            ops += 1
            if got == 0:
                raise CorruptDataError(
                    path, off + done, f"file ends before the record ({ln} bytes at {off})"
                )
            done += got
        return ops, time.perf_counter() - t0

    def _run(self, reads: ReadList, buf: np.ndarray, lo: int, hi: int) -> tuple[int, int, float]:
        mv = memoryview(buf).cast("B")
        ops, nbytes, secs = 0, 0, 0.0
        for i in range(lo, hi):
            ln = int(reads.lengths[i])
            o, s = self._read_one(
                mv, int(reads.file_ids[i]), int(reads.offsets[i]), ln, int(reads.dest[i])
            )
            ops += o
            nbytes += ln
            secs += s
        return ops, nbytes, secs

    def submit(self, reads: ReadList, buf: np.ndarray) -> Future:
        n = len(reads)
        parts = max(1, min(self.threads, n))
        bounds = [n * i // parts for i in range(parts + 1)]
        futs = [
            self._pool.submit(self._run, reads, buf, bounds[i], bounds[i + 1]) for i in range(parts)
        ]
        done: Future = Future()
        remaining = [len(futs)]
        lock = threading.Lock()

        def finish(f: Future) -> None:
            with lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if not last:
                return
            err = next((x.exception() for x in futs if x.exception() is not None), None)
            if err is not None:
                done.set_exception(err)
                return
            for x in futs:
                o, b, s = x.result()
                with self._lock:
                    self._stats["storage_ops"] += o
                    self._stats["storage_bytes"] += b
                    self._stats["io_s"] += s
            done.set_result(None)

        for f in futs:
            f.add_done_callback(finish)
        return done

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._stats, engine="python-preadv", io_threads=self.threads)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for fd in self._fds.values():
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._fds.clear()


class _Native:
    """The native engine (:class:`feedline.io.engine.IOEngine`): C++ threads,
    pread/O_DIRECT, retries of transient errors, typed errors from ``result()``."""

    def __init__(self, files: list[str], threads: int, method: str) -> None:
        from .. import defaults
        from ..io.engine import IOEngine

        self._impl = IOEngine(
            files,
            threads=threads,
            method=method,
            retry_backoff_s=float(defaults.get("io_retry_backoff_ms")) * 1e-3,
        )
        self.threads = threads
        self.method = method

    def abandon(self) -> None:
        self._impl.abandon()

    def submit(self, reads: ReadList, buf: np.ndarray) -> Any:
        return self._impl.submit(reads, buf, reads.dest)

    def stats(self) -> dict[str, Any]:
        st = self._impl.stats()
        return {
            "storage_bytes": int(st.storage_bytes),
            "storage_ops": int(st.ops),
            "io_s": float(st.busy_s),
            "io_retries": int(st.retries),
            "engine": f"native-{self.method}",
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
        Read method; the Python fallback always uses ``pread``.

    Thread safety: ``submit`` may be called from any thread; statistics are totals
    over all submitted reads.
    """

    def __init__(
        self, files: list[str], threads: int, method: str = "pread", *, timeout_s: float = 0.0
    ) -> None:
        self._impl: Any = None
        self.files = list(files)
        self.timeout_s = float(timeout_s or 0.0)
        self.abandoned: str | None = None  # why the reads were abandoned (a stall)
        try:
            self._impl = _Native(files, threads, method)
        except (ImportError, AttributeError):  # the native core is not built
            self._impl = _PreadPool(files, threads, method)

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
        abandon = getattr(self._impl, "abandon", None)
        if abandon is not None:
            abandon()
        else:  # the Python pool: stop queueing, leave the running reads
            self._impl._pool.shutdown(wait=False, cancel_futures=True)

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
        if isinstance(self._fut, Future):  # the Python pool's
            try:
                return self._fut.result(timeout=max(left, 0.0))
            except TimeoutError:
                pass
        elif self._fut.wait(max(left, 0.0)):
            return self._fut.result()
        err = StorageTimeoutError(self._path, self._off, r.timeout_s)
        r._abandon(self._fut, self._buf, str(err))
        raise err
