# SPDX-License-Identifier: Apache-2.0
"""feedline's I/O layer: the native engine and the storage-backend protocol.

:class:`IOEngine` reads lists of extents into caller buffers on a pool of C++ threads
(``pread``, ``O_DIRECT`` or ``mmap``); :class:`StorageBackend` is DeepIO's portable
``init``/``read`` API, with the engine as the POSIX backend. See ``docs/io-engine.md``.
"""

from __future__ import annotations

from .backend import BACKENDS, FilesBackend, PosixBackend, StorageBackend, backend
from .engine import (
    METHODS,
    BenchResult,
    Future,
    IOEngine,
    IOStats,
    RawBuffer,
    aligned_empty,
    bench_read,
    evict,
    extent_columns,
    resident_bytes,
)

__all__ = [
    "BACKENDS",
    "METHODS",
    "BenchResult",
    "FilesBackend",
    "Future",
    "IOEngine",
    "IOStats",
    "PosixBackend",
    "RawBuffer",
    "StorageBackend",
    "aligned_empty",
    "backend",
    "bench_read",
    "evict",
    "extent_columns",
    "resident_bytes",
]
