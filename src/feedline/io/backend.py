# SPDX-License-Identifier: Apache-2.0
"""Storage backends: DeepIO's portable storage API.

DeepIO (§III-D) keeps *what* to read (element ids, planned by the framework) apart from
*how* a store reads it: a backend supplies an init function and a read function that
fills the output with the requested elements. Here a backend is initialised with the
dataset's files and reads byte extents into caller buffers. Two backends come with
feedline: ``files`` (:class:`FilesBackend`, plain POSIX ``pread`` from Python, one call
per extent: the reference, and the template for a new store) and ``native`` (alias
``posix``: :class:`PosixBackend`, feedline's C++ engine with its threads, ``O_DIRECT``
and retries). The portable API of :mod:`feedline.deepio` reads through either. The trade-off: a backend sees only extents
and buffers, never samples or plans, so stores (object stores, burst buffers, an MPI
in-memory store) plug in with two methods but cannot reorder what the planner decided.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from ..errors import ConfigError, CorruptDataError, StorageError
from .engine import IOEngine, IOStats, RawBuffer, extent_columns


@runtime_checkable
class StorageBackend(Protocol):
    """What the loader needs from a store.

    ``init(files, **options)`` prepares the store for a list of files (DeepIO's
    ``fs_init``); ``read(extents, buffers)`` fills buffers with the extents' bytes and
    returns :class:`~feedline.io.engine.IOStats` (DeepIO's ``fs_read``); ``close()``
    releases what ``init`` acquired. *extents* are ``(file_ids, offsets, lengths)``
    columns (or an (n, 3) array); *buffers* is one writable buffer that receives the
    extents back to back, or a sequence with one buffer per extent. Optional
    capabilities are ``supports_*`` attributes.
    """

    def init(self, files: Sequence[str], **options: Any) -> None: ...

    def read(self, extents: Any, buffers: Any) -> IOStats: ...

    def close(self) -> None: ...


class PosixBackend:
    """The POSIX file backend: the native engine (``pread``, ``O_DIRECT`` or ``mmap``).

    Parameters
    ----------
    **options
        Defaults for :class:`~feedline.io.engine.IOEngine` (``threads``, ``method``,
        ``chunk_bytes``, ...); ``init`` options override them.
    """

    name = "posix"
    supports_direct_io = True  # method="odirect" bypasses the page cache
    supports_raw_buffers = True  # RawBuffer destinations (MPI window memory)

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._engine: IOEngine | None = None

    @property
    def engine(self) -> IOEngine:
        """The engine created by :meth:`init`."""
        if self._engine is None:
            raise ConfigError("PosixBackend.read before init()")
        return self._engine

    def init(self, files: Sequence[str | os.PathLike[str]], **options: Any) -> None:
        """Start an engine over *files* (closing a previous one)."""
        self.close()
        self._engine = IOEngine(files, **{**self._options, **options})

    def read(self, extents: Any, buffers: Any) -> IOStats:
        """Read *extents* into *buffers* (one buffer, back to back; or one per extent)."""
        eng = self.engine
        if isinstance(buffers, list | tuple):
            fid, off, ln = extent_columns(extents)
            if len(buffers) != len(fid):
                raise ValueError(f"{len(buffers)} buffers for {len(fid)} extents")
            t0 = time.perf_counter()
            futures = [
                eng.submit((fid[i : i + 1], off[i : i + 1], ln[i : i + 1]), b)
                for i, b in enumerate(buffers)
            ]
            total = IOStats()
            for f in futures:
                total = total + f.result()
            return _with_wall(total, time.perf_counter() - t0)
        return eng.read(extents, buffers)

    def stats(self) -> IOStats:
        """Cumulative statistics of the engine."""
        return self.engine.stats()

    def close(self) -> None:
        """Close the engine (idempotent)."""
        if self._engine is not None:
            self._engine.close()
            self._engine = None


class FilesBackend:
    """The plainest backend: ``os.pread`` per extent from Python, no threads.

    A short read (the file ends inside an extent) raises
    :class:`~feedline.errors.CorruptDataError`; an ``OSError`` raises
    :class:`~feedline.errors.StorageError`, both naming file and offset.
    """

    name = "files"
    supports_direct_io = False
    supports_raw_buffers = False

    def __init__(self, **options: Any) -> None:
        self._files: list[str] = []
        self._fds: dict[int, int] = {}
        self._stats = IOStats()

    def init(self, files: Sequence[str | os.PathLike[str]], **options: Any) -> None:
        """Remember *files* (opened on first read)."""
        self.close()
        self._files = [os.fspath(f) for f in files]

    def _fd(self, i: int) -> int:
        if not 0 <= i < len(self._files):
            raise IndexError(f"file_id {i} outside the file table ({len(self._files)} files)")
        fd = self._fds.get(i)
        if fd is None:
            try:
                fd = os.open(self._files[i], os.O_RDONLY)
            except OSError as e:
                raise StorageError(self._files[i], 0, e.errno or 5) from e
            self._fds[i] = fd
        return fd

    def read(self, extents: Any, buffers: Any) -> IOStats:
        """Read *extents* into *buffers* (one buffer back to back, or one per extent)."""
        if not self._files and not self._fds:
            raise ConfigError("FilesBackend.read before init()")
        fid, off, ln = extent_columns(extents)
        per = isinstance(buffers, list | tuple)
        if per and len(buffers) != len(fid):
            raise ValueError(f"{len(buffers)} buffers for {len(fid)} extents")
        t0 = time.perf_counter()
        views = [memoryview(b).cast("B") for b in buffers] if per else []
        whole = memoryview(b"") if per else memoryview(buffers).cast("B")
        if not per and int(ln.sum()) > whole.nbytes:
            raise ValueError(
                f"{int(ln.sum())} bytes of extents overflow a {whole.nbytes}-byte buffer"
            )
        pos = ops = 0
        for i in range(len(fid)):
            f, o, n = int(fid[i]), int(off[i]), int(ln[i])
            if o < 0 or n < 0:
                raise ValueError(f"negative offset or length in extent {i}")
            dst = views[i][:n] if per else whole[pos : pos + n]
            pos += n
            got = 0
            while got < n:
                try:
                    k = os.preadv(self._fd(f), [dst[got:]], o + got)
                except OSError as e:
                    raise StorageError(self._files[f], o + got, e.errno or 5) from e
                ops += 1
                if k == 0:
                    raise CorruptDataError(
                        self._files[f], o + got, f"file ends inside an extent of {n} bytes"
                    )
                got += k
        st = IOStats(
            bytes=pos,
            storage_bytes=pos,
            ops=ops,
            extents=len(fid),
            tasks=len(fid),
            submissions=1,
            wall_s=time.perf_counter() - t0,
        )
        self._stats = self._stats + st
        return st

    def stats(self) -> IOStats:
        """Cumulative statistics."""
        return self._stats

    def close(self) -> None:
        """Close the files (idempotent)."""
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)


def _with_wall(st: IOStats, wall_s: float) -> IOStats:
    d = st.as_dict()
    d["wall_s"] = wall_s
    return IOStats(**d)


BACKENDS: dict[str, Callable[..., StorageBackend]] = {
    "posix": PosixBackend,
    "native": PosixBackend,
    "files": FilesBackend,
}


def backend(name: str = "posix", **options: Any) -> StorageBackend:
    """A new, uninitialised backend from the registry :data:`BACKENDS`."""
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise ConfigError(f"unknown storage backend {name!r}; known: {sorted(BACKENDS)}") from None
    return factory(**options)


__all__ = ["BACKENDS", "FilesBackend", "PosixBackend", "RawBuffer", "StorageBackend", "backend"]
