# SPDX-License-Identifier: Apache-2.0
"""The delivery digest: one SHA-256 over what every rank received, in rank order.

docs/benchmarks.md defines it ("What one job does"): for each rank in order and each of its steps, rank (u32 LE) and
step (u64 LE), then per sample its id (u64 LE), length (u64 LE) and raw record bytes.
Two runs with the same assignment must produce the same digest whatever their I/O method.

SHA-256 cannot be combined from per-rank parts, so each rank keeps what it received (a
:class:`DeliveryRecorder`: ids and lengths per step, and the records' bytes copied once,
in memory and spilled to an unlinked temporary file on tmpfs beyond a small cap) and,
after the timed run, rebuilds its stream while rank 0 receives the streams in rank order
in fixed-size chunks and hashes them incrementally. The recorder times itself so that
runners can subtract the copying from their measured time: the digest stays outside
timed regions, though its one copy per delivered byte still shares the CPU with the
ranks being timed.
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

_STEP = struct.Struct("<IQ")
_SAMPLE = struct.Struct("<QQ")
#: bytes per message when rank 0 collects the streams
CHUNK_BYTES = 4 << 20
#: bytes a recorder keeps in memory before spilling to a temporary file (small, so the
#: copy does not inflate the peak RSS the benchmark reports)
SPILL_BYTES = 16 << 20


def _spill_dir() -> str | None:
    """tmpfs when there is one: spilling must not put write-back traffic on the disk
    that the next run measures."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def _bytes_view(raw) -> memoryview:
    if isinstance(raw, np.ndarray):
        raw = np.ascontiguousarray(raw)
    view = memoryview(raw)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _checked(ids, lengths, raw) -> tuple[np.ndarray, np.ndarray, memoryview]:
    """One step's ids and lengths as int64 and its records as bytes, checked to agree."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if len(ids) != len(lengths):
        raise ValueError(f"{len(ids)} ids but {len(lengths)} lengths")
    view = _bytes_view(raw)
    if int(lengths.sum()) != view.nbytes:
        raise ValueError(f"lengths sum to {int(lengths.sum())} but raw holds {view.nbytes} bytes")
    return ids, lengths, view


def step_bytes(rank: int, step: int, ids, lengths, raw) -> Iterator[bytes | memoryview]:
    """The digest byte sequence of one step of one rank, in pieces.

    Parameters
    ----------
    rank, step : int
    ids, lengths : sequence of int
        Global sample ids and record lengths, in delivery order.
    raw : bytes-like
        The records, concatenated in the same order.
    """
    ids, lengths, view = _checked(ids, lengths, raw)
    yield _STEP.pack(rank, step)
    pos = 0
    for i, ln in zip(ids.tolist(), lengths.tolist(), strict=True):
        yield _SAMPLE.pack(i, ln)
        yield view[pos : pos + ln]
        pos += ln


def digest_of(deliveries: Iterable[Iterable[tuple[int, Any, Any, Any]]]) -> str:
    """Digest computed directly from ``deliveries[rank] = [(step, ids, lengths, raw), ...]``.

    The reference definition; :func:`gather_digest` must agree with it.
    """
    h = hashlib.sha256()
    for rank, steps in enumerate(deliveries):
        for step, ids, lengths, raw in steps:
            for piece in step_bytes(rank, step, ids, lengths, raw):
                h.update(piece)
    return h.hexdigest()


class DeliveryRecorder:
    """One rank's digest stream, kept while a runner delivers batches.

    Parameters
    ----------
    rank : int
        This rank (written into every step header).
    enabled : bool
        When False, :meth:`add` only counts (no copy, no digest).

    Attributes
    ----------
    seconds : float
        Time spent inside :meth:`add`; runners subtract it from their timed region.
    steps, samples, payload_bytes : int
        What was delivered.
    """

    def __init__(self, rank: int, *, enabled: bool = True, spill_bytes: int = SPILL_BYTES) -> None:
        self.rank = rank
        self.enabled = enabled
        self.seconds = 0.0
        self.steps = 0
        self.samples = 0
        self.payload_bytes = 0
        self._spill_bytes = spill_bytes
        # the stream is rebuilt when the digest is taken: per step its ids and lengths,
        # and its records' bytes copied once (to memory, then to a file beyond the cap)
        self._meta: list[tuple[int, np.ndarray, np.ndarray]] = []
        self._mem: list[bytes] = []
        self._raw_bytes = 0
        self._stream_bytes = 0
        self._file: Any = None

    def add(self, step: int, ids, lengths, raw) -> None:
        """Record one delivered step (copies the bytes once; time excluded via ``seconds``)."""
        t0 = time.perf_counter()
        lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
        self.steps += 1
        self.samples += len(lengths)
        self.payload_bytes += int(lengths.sum())
        if self.enabled:
            ids, lengths, view = _checked(ids, lengths, raw)
            self._meta.append((int(step), ids.copy(), lengths.copy()))
            self._write(view)
            self._stream_bytes += _STEP.size + len(ids) * _SAMPLE.size + view.nbytes
        self.seconds += time.perf_counter() - t0

    def _write(self, view: memoryview) -> None:
        if self._file is None and self._raw_bytes + view.nbytes > self._spill_bytes:
            # unlinked at creation; closed by close() when the digest is taken
            self._file = tempfile.TemporaryFile(prefix="feedline-digest-", dir=_spill_dir())  # noqa: SIM115
            for b in self._mem:
                self._file.write(b)
            self._mem.clear()
        if self._file is not None:
            self._file.write(view)
        else:
            self._mem.append(bytes(view))
        self._raw_bytes += view.nbytes

    @property
    def nbytes(self) -> int:
        """Length of the stream so far."""
        return self._stream_bytes

    def _raws(self) -> Iterator[bytes]:
        if self._file is None:
            yield from self._mem
            return
        self._file.flush()
        self._file.seek(0)
        for _, _, lengths in self._meta:
            n = int(lengths.sum())
            raw = self._file.read(n)
            if len(raw) != n:  # pragma: no cover - our own file, on tmpfs
                raise OSError(f"digest stream: {len(raw)} of {n} bytes read back")
            yield raw

    def chunks(self, size: int = CHUNK_BYTES) -> Iterator[bytes]:
        """The stream (:func:`step_bytes` of every step) in pieces of at most *size* bytes."""
        buf = bytearray()
        for (step, ids, lengths), raw in zip(self._meta, self._raws(), strict=True):
            for piece in step_bytes(self.rank, step, ids, lengths, raw):
                buf += piece
            while len(buf) >= size:
                yield bytes(buf[:size])
                del buf[:size]
        if buf:
            yield bytes(buf)

    def close(self) -> None:
        """Drop the stream (and its temporary file)."""
        self._meta.clear()
        self._mem.clear()
        if self._file is not None:
            self._file.close()
            self._file = None


def gather_digest(recorder: DeliveryRecorder, comm: Any = None) -> str | None:
    """Hash every rank's stream in rank order on rank 0; other ranks get None.

    Collective over *comm* (None: a single process). Streams travel in chunks of
    :data:`CHUNK_BYTES`, an empty chunk ending each rank's stream, so rank 0 never
    holds more than one chunk of another rank.
    """
    if comm is None or comm.Get_size() == 1:
        h = hashlib.sha256()
        for piece in recorder.chunks():
            h.update(piece)
        return h.hexdigest()
    rank, size = comm.Get_rank(), comm.Get_size()
    tag = 7301
    if rank != 0:
        # rank 0 asks for each stream in turn, so ranks do not all flood it at once
        comm.recv(source=0, tag=tag)
        for piece in recorder.chunks():
            comm.send(piece, dest=0, tag=tag)
        comm.send(b"", dest=0, tag=tag)
        return None
    h = hashlib.sha256()
    for piece in recorder.chunks():
        h.update(piece)
    for src in range(1, size):
        comm.send(None, dest=src, tag=tag)
        while piece := comm.recv(source=src, tag=tag):
            h.update(piece)
    return h.hexdigest()
