# SPDX-License-Identifier: Apache-2.0
"""Runners: the named configurations a benchmark compares, and the built-in peers.

A runner executes one configuration on one rank for a number of steps and delivers,
per step, the sample ids, lengths and raw bytes it read (into a
:class:`~feedline_tools.bench.digest.DeliveryRecorder`). The worker times ``run`` between two
barriers and measures the process-level costs around it (context switches, faults, RSS);
a runner reports what only it can see: time in reads (``io_s``), time spent locating
records (``seek_s``), time the consumer waited for data (``exposed_io_s``), and the
bytes and operations it asked of the storage.

Built-in peers need nothing but the files and a sample layout, so the harness can be
tested before the Loader or any format exists:

- ``seq`` — BeeGFS-like: each rank reads the bytes of its samples with large
  sequential ``pread`` calls (``block`` bytes) and slices samples out of the stream.
- ``pread`` — one ``pread`` per sample (TensorFlow-like per-sample reads).
- ``mmap`` — the files mapped, samples copied out in ``block``-byte pieces (LMDB's I/O
  path without its tree walk; the "mmap" line of LMDBIO Fig. 8).
- ``torch`` — a PyTorch ``DataLoader`` over a map-style dataset of per-sample reads.
- ``lmdb`` — a liblmdb cursor (py-lmdb) that, like Caffe, walks from the first key to
  the rank's first record and then reads its sub-batches.
- ``loader:<preset>`` — ``feedline.Loader(ds, batch_size, preset=..., decode=False)``.

Peers deliver the order of any planner preset or assignment (``contiguous`` by
default: rank r owns one region of the samples; ``strided``: Caffe's identity order;
``global``, ``tf``, ...), computed with :func:`feedline.plan.make_plan`, so a peer and a
Loader preset with the same assignment deliver identical streams and their digests can
be compared. ``seq`` is meant for orders that read forward (``contiguous``,
``strided``): on a shuffled order it keeps everything from the rank's first needed
byte.
"""

from __future__ import annotations

import bisect
import contextlib
import mmap
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from feedline.errors import ConfigError, StorageError
from feedline.index import Index
from feedline.plan.world import WorldSpec
from feedline_tools.bench.digest import DeliveryRecorder

# --------------------------------------------------------------------------- data


@dataclass(frozen=True, slots=True)
class DatasetSpec:
    """What a benchmark reads: a path (``{node}`` is replaced by the node index), a
    format and its options, as passed to :func:`feedline.open_dataset`."""

    path: str
    format: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def path_for(self, node: int) -> str:
        """The path as seen from *node* (docs/planner.md: node = rank·M // P)."""
        return self.path.replace("{node}", str(node))

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "format": self.format, "options": dict(self.options)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DatasetSpec:
        return cls(d["path"], d.get("format"), dict(d.get("options") or {}))


class Source:
    """A rank's view of the dataset: files, index and (lazily) a feedline Dataset.

    ``format="records"`` falls back to computing the index from ``record_bytes`` and
    ``header_bytes`` when the records format is not installed, so peers work on plain
    binary files with nothing else; for other formats not installed, ``files`` is every
    file under the path (enough for peers such as ``lmdb`` that need no index).
    """

    def __init__(self, spec: DatasetSpec, node: int = 0) -> None:
        self.spec = spec
        self.node = node
        self.path = spec.path_for(node)
        self._dataset: Any = None
        self._index: Index | None = None
        self._files: list[str] | None = None

    @property
    def dataset(self) -> Any:
        """The :class:`feedline.Dataset` (opened on first use)."""
        if self._dataset is None:
            from feedline.dataset import open_dataset

            self._dataset = open_dataset(self.path, format=self.spec.format, **self.spec.options)
        return self._dataset

    @property
    def index(self) -> Index:
        if self._index is None:
            try:
                self._index = self.dataset.index
            except ModuleNotFoundError as e:
                if self.spec.format != "records" or not (e.name or "").startswith("feedline"):
                    raise
                self._index = records_index(self.files, **self.spec.options)
        return self._index

    @property
    def files(self) -> list[str]:
        if self._files is None:
            if self._index is not None:
                self._files = list(self._index.files)
            else:
                from feedline.formats.base import resolve_files

                try:
                    self._files = list(self.dataset.files)
                except ModuleNotFoundError as e:
                    if not (e.name or "").startswith("feedline"):
                        raise
                    # format not installed: every regular file under the path
                    self._files = resolve_files(self.path, (), self.spec.format or "data")[1]
        return self._files

    def close(self) -> None:
        if self._dataset is not None:
            self._dataset.close()


def records_index(
    files: list[str], record_bytes: int, header_bytes: int = 0, label_bytes: int = 0
) -> Index:
    """Index of fixed-length records: record k of a file at ``header + k·record_bytes``.

    ``label_bytes`` is part of each record here (the raw record is all its bytes).
    """
    if record_bytes <= 0 or header_bytes < 0:
        raise ConfigError("record_bytes must be > 0 and header_bytes >= 0")
    fids, offs = [], []
    for fid, f in enumerate(files):
        n = max(0, (os.path.getsize(f) - header_bytes) // record_bytes)
        fids.append(np.full(n, fid, dtype=np.int32))
        offs.append(header_bytes + np.arange(n, dtype=np.int64) * record_bytes)
    offsets = np.concatenate(offs) if offs else np.zeros(0, np.int64)
    return Index(
        files=list(files),
        file_ids=np.concatenate(fids) if fids else np.zeros(0, np.int32),
        offsets=offsets,
        lengths=np.full(len(offsets), record_bytes, dtype=np.int64),
        meta={"record_bytes": record_bytes, "header_bytes": header_bytes},
    )


# ------------------------------------------------------------------- assignment


def assignment(
    kind: str,
    n: Any,
    batch_size: int,
    rank: int,
    size: int,
    steps: int | None = None,
    *,
    seed: int = 0,
    nodes: int = 1,
    epoch: int = 0,
) -> list[np.ndarray]:
    """Sample ids of each of this rank's steps in *epoch* (every rank gets the same count).

    *kind* is any preset or assignment name of the planner (``contiguous``, ``strided``,
    ``skip``, ``global``, ``lmdb``, ``tf``, ...), so a peer delivers exactly the order
    the corresponding Loader preset delivers. *n* is a sample count or the dataset's
    index (or any records :func:`~feedline.plan.make_plan` takes): ``feedline``'s tiles
    are sized by the mean record length, so only the index gives its exact order.
    *steps* (None: one epoch) is capped at one epoch.
    """
    from feedline.plan import make_plan

    if batch_size < 1:
        raise ConfigError(f"batch size must be >= 1, got {batch_size}")
    plan = make_plan(n, WorldSpec(size, nodes), kind, seed, epoch, batch_size)
    ids, offs = plan.rank_samples(rank)
    total = len(offs) - 1
    steps = total if steps is None else min(steps, total)
    return [np.asarray(ids[offs[s] : offs[s + 1]], dtype=np.int64) for s in range(steps)]


# -------------------------------------------------------------------- protocol


@dataclass
class RunContext:
    """Everything a runner needs on one rank."""

    rank: int
    size: int
    nodes: int
    node: int
    comm: Any
    source: Source
    batch_size: int
    steps: int | None = None
    compute_s: float = 0.0
    seed: int = 0
    assignment: str = "contiguous"

    def my_steps(self, n: int | None = None, epoch: int = 0) -> list[np.ndarray]:
        """This rank's sample ids per step of *epoch* under the peers' assignment."""
        return assignment(
            self.assignment,
            self.source.index if n is None else n,  # the index: record lengths size tiles
            self.batch_size,
            self.rank,
            self.size,
            self.steps,
            seed=self.seed,
            nodes=self.nodes,
            epoch=epoch,
        )

    def compute(self) -> None:
        """Emulated compute of one step."""
        if self.compute_s > 0:
            time.sleep(self.compute_s)


@dataclass
class RunOutcome:
    """What a runner reports about one timed run on one rank (seconds and counts)."""

    io_s: float = 0.0
    seek_s: float = 0.0
    exposed_io_s: float = 0.0
    storage_bytes: int = 0
    storage_ops: int = 0
    rl: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Runner(Protocol):
    """A configuration executed on every rank. ``prepare`` and ``close`` are untimed;
    ``close`` must release mappings so the next eviction works."""

    def prepare(self, ctx: RunContext) -> None: ...

    def run(self, ctx: RunContext, rec: DeliveryRecorder) -> RunOutcome: ...

    def close(self) -> None: ...


RunnerFactory = Callable[..., Runner]
RUNNERS: dict[str, RunnerFactory] = {}


def register_runner(name: str) -> Callable[[RunnerFactory], RunnerFactory]:
    """Decorator: make a runner factory available as *name* (``name:arg`` passes arg)."""

    def deco(factory: RunnerFactory) -> RunnerFactory:
        RUNNERS[name] = factory
        return factory

    return deco


def make_runner(spec: str, options: dict[str, Any] | None = None) -> Runner:
    """Build the runner named *spec* (``"seq"``, ``"loader:feedline"``, ...)."""
    name, _, arg = spec.partition(":")
    factory = RUNNERS.get(name)
    if factory is None:
        raise ConfigError(f"unknown runner {spec!r}; known: {sorted(RUNNERS)}")
    try:
        return factory(arg or None, **(options or {}))
    except TypeError as e:
        raise ConfigError(f"runner {spec!r}: {e}") from None


# ------------------------------------------------------------------------ peers


def _extents(index: Index, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return index.file_ids[ids], index.offsets[ids], index.lengths[ids]


def _one_span(fids: np.ndarray, offs: np.ndarray, lens: np.ndarray) -> bool:
    """True when the records lie back to back in one file, in order."""
    if len(offs) <= 1:
        return True
    return bool((fids == fids[0]).all() and (offs[1:] == offs[:-1] + lens[:-1]).all())


def _majflt() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


class _Files:
    """File descriptors opened on demand, closed together."""

    def __init__(self, files: list[str]) -> None:
        self.files = files
        self.fds: dict[int, int] = {}

    def fd(self, fid: int) -> int:
        fd = self.fds.get(fid)
        if fd is None:
            fd = self.fds[fid] = os.open(self.files[fid], os.O_RDONLY)
        return fd

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


class _PeerBase:
    """Shared plumbing: the rank's steps computed in ``prepare`` (untimed)."""

    def __init__(self, arg: str | None = None) -> None:
        if arg:
            raise ConfigError(f"{type(self).__name__} takes no ':argument'")
        self._steps: list[np.ndarray] = []
        self._files: _Files | None = None

    def prepare(self, ctx: RunContext) -> None:
        self._index = ctx.source.index
        self._steps = ctx.my_steps()

    def close(self) -> None:
        if self._files is not None:
            self._files.close()
            self._files = None


class _Stream:
    """One file read forward in *block*-byte ``pread`` s, kept as a list of blocks from
    which byte ranges are sliced without copying."""

    def __init__(self, path: str, fd: int, start: int, block: int) -> None:
        self.path, self.fd, self.block = path, fd, block
        self.offs: list[int] = []
        self.bufs: list[bytes] = []
        self.head = 0  # first block still needed
        self.pos = start  # next byte to read

    def fill(self, end: int, out: RunOutcome) -> None:
        t0 = time.perf_counter()
        while self.pos < end:
            data = os.pread(self.fd, self.block, self.pos)
            out.storage_ops += 1
            if not data:
                raise StorageError(self.path, self.pos, 0, "seq: unexpected end of file")
            out.storage_bytes += len(data)
            self.offs.append(self.pos)
            self.bufs.append(data)
            self.pos += len(data)
        out.io_s += time.perf_counter() - t0

    def take(self, a: int, b: int) -> list[memoryview]:
        if self.head >= len(self.offs) or a < self.offs[self.head]:
            raise StorageError(self.path, a, 0, "seq: record behind the stream")
        i = bisect.bisect_right(self.offs, a, lo=self.head) - 1
        pieces = []
        while a < b:
            o, d = self.offs[i], self.bufs[i]
            hi = min(b - o, len(d))
            pieces.append(memoryview(d)[a - o : hi])
            a, i = o + hi, i + 1
        return pieces

    def drop(self, keep: int) -> None:
        """Forget blocks that end at or before *keep*."""
        while (
            self.head < len(self.offs) and self.offs[self.head] + len(self.bufs[self.head]) <= keep
        ):
            self.bufs[self.head] = b""
            self.head += 1
        if self.head > 256 and 2 * self.head > len(self.offs):
            del self.offs[: self.head], self.bufs[: self.head]
            self.head = 0


@register_runner("seq")
class SeqRunner(_PeerBase):
    """Large sequential ``pread`` s over the rank's bytes; samples sliced from the stream.

    Each file is read forward from the rank's first byte in *block*-byte reads; a step
    is delivered once the stream covers its records, and blocks no future record of
    the rank needs are dropped.
    """

    def __init__(self, arg: str | None = None, block: int = 8 << 20) -> None:
        super().__init__(arg)
        if block < 1:
            raise ConfigError("block must be >= 1 byte")
        self.block = int(block)

    def run(self, ctx: RunContext, rec: DeliveryRecorder) -> RunOutcome:
        index, out = self._index, RunOutcome()
        files = self._files = _Files(index.files)
        all_ids = np.concatenate(self._steps) if self._steps else np.zeros(0, np.int64)
        # per file: the earliest offset still needed from each delivery position onwards
        fids_all, offs_all, _ = _extents(index, all_ids)
        need_from: dict[int, np.ndarray] = {}
        for fid in set(fids_all.tolist()):
            o = np.where(fids_all == fid, offs_all, np.iinfo(np.int64).max)
            need_from[fid] = np.minimum.accumulate(o[::-1])[::-1]
        streams: dict[int, _Stream] = {}
        done = 0  # samples delivered so far
        for step, ids in enumerate(self._steps):
            fids, offs, lens = _extents(index, ids)
            ends = offs + lens
            for fid in sorted(set(fids.tolist())):
                st = streams.get(fid)
                if st is None:
                    start = int(need_from[fid][done])
                    st = streams[fid] = _Stream(files.files[fid], files.fd(fid), start, self.block)
                st.fill(int(ends[fids == fid].max()), out)
            if len(ids) and _one_span(fids, offs, lens):
                pieces = streams[int(fids[0])].take(int(offs[0]), int(ends[-1]))
            else:
                pieces = [
                    p
                    for f, a, b in zip(fids.tolist(), offs.tolist(), ends.tolist(), strict=True)
                    for p in streams[f].take(a, b)
                ]
            raw = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            rec.add(step, ids, lens, raw)
            del raw, pieces
            done += len(ids)
            for fid, st in streams.items():
                st.drop(int(need_from[fid][done]) if done < len(all_ids) else st.pos)
            ctx.compute()
        out.exposed_io_s = out.io_s
        return out


@register_runner("pread")
class PreadRunner(_PeerBase):
    """One ``pread`` per sample, synchronous (TensorFlow-like per-sample reads)."""

    def run(self, ctx: RunContext, rec: DeliveryRecorder) -> RunOutcome:
        index, out = self._index, RunOutcome()
        files = self._files = _Files(index.files)
        for step, ids in enumerate(self._steps):
            fids, offs, lens = _extents(index, ids)
            t0 = time.perf_counter()
            parts = []
            for fid, off, ln in zip(fids.tolist(), offs.tolist(), lens.tolist(), strict=True):
                data = os.pread(files.fd(fid), ln, off)
                if len(data) != ln:
                    raise StorageError(files.files[fid], off + len(data), 0, "short read")
                parts.append(data)
            raw = b"".join(parts)
            out.io_s += time.perf_counter() - t0
            out.storage_ops += len(parts)
            out.storage_bytes += len(raw)
            rec.add(step, ids, lens, raw)
            ctx.compute()
        out.exposed_io_s = out.io_s
        return out


@register_runner("mmap")
class MmapRunner(_PeerBase):
    """Files mapped read-only; each step's records copied out in *block*-byte pieces.

    The copy is the only thing that triggers I/O (page faults), so the block size does
    not reach the storage: this is the mmap line of LMDBIO Fig. 8. ``storage_ops``
    counts major page faults.
    """

    def __init__(self, arg: str | None = None, block: int = 4096) -> None:
        super().__init__(arg)
        if block < 1:
            raise ConfigError("block must be >= 1 byte")
        self.block = int(block)
        self._maps: dict[int, mmap.mmap] = {}

    def _map(self, fid: int) -> np.ndarray:
        m = self._maps.get(fid)
        if m is None:
            assert self._files is not None
            m = self._maps[fid] = mmap.mmap(self._files.fd(fid), 0, prot=mmap.PROT_READ)
        return np.frombuffer(m, dtype=np.uint8)

    def run(self, ctx: RunContext, rec: DeliveryRecorder) -> RunOutcome:
        index, out = self._index, RunOutcome()
        self._files = _Files(index.files)
        flt0 = _majflt()
        bs = self.block
        for step, ids in enumerate(self._steps):
            fids, offs, lens = _extents(index, ids)
            raw = np.empty(int(lens.sum()), dtype=np.uint8)
            t0 = time.perf_counter()
            if len(ids) and _one_span(fids, offs, lens):
                src, base = self._map(int(fids[0])), int(offs[0])
                spans = [(base, 0, raw.size)]
            else:
                src = None
                dst = np.concatenate([[0], np.cumsum(lens)[:-1]]) if len(ids) else np.zeros(0)
                spans = list(zip(offs.tolist(), list(map(int, dst)), lens.tolist(), strict=True))
            for k, (off, d, ln) in enumerate(spans):
                m = src if src is not None else self._map(int(fids[k]))
                for p in range(0, ln, bs):
                    q = min(ln, p + bs)
                    raw[d + p : d + q] = m[off + p : off + q]
                    out.storage_bytes += q - p
            out.io_s += time.perf_counter() - t0
            rec.add(step, ids, lens, raw)
            ctx.compute()
        out.storage_ops = _majflt() - flt0
        out.exposed_io_s = out.io_s
        return out

    def close(self) -> None:
        for m in self._maps.values():
            with contextlib.suppress(BufferError):  # a view still exists; freed with it
                m.close()
        self._maps.clear()
        super().close()


class PerFileSamples:
    """Map-style dataset of ``(id, bytes)`` samples spread over files, for a PyTorch
    ``DataLoader``: one handle per file, opened lazily in each process (handles are
    dropped when the dataset is pickled, so workers open their own)."""

    def __init__(self, files: list[str], file_ids: np.ndarray) -> None:
        self.files = list(files)
        self.file_ids = np.asarray(file_ids)
        self._handles: dict[int, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        d["_handles"] = {}
        return d

    def __len__(self) -> int:
        return len(self.file_ids)

    def handle(self, fid: int) -> Any:
        """This process's handle of file *fid*."""
        h = self._handles.get(fid)
        if h is None:
            h = self._handles[fid] = self._open(fid)
        return h

    def _open(self, fid: int) -> Any:
        raise NotImplementedError

    def _close(self, handle: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        for h in self._handles.values():
            self._close(h)
        self._handles.clear()


class SampleReads(PerFileSamples):
    """One ``pread`` per sample."""

    def __init__(self, index: Index) -> None:
        super().__init__(index.files, index.file_ids)
        self.offsets = np.asarray(index.offsets)
        self.lengths = np.asarray(index.lengths)

    def _open(self, fid: int) -> int:
        return os.open(self.files[fid], os.O_RDONLY)

    def _close(self, handle: int) -> None:
        os.close(handle)

    def __getitem__(self, i: int) -> tuple[int, bytes]:
        fd = self.handle(int(self.file_ids[i]))
        return int(i), os.pread(fd, int(self.lengths[i]), int(self.offsets[i]))


def collate_samples(items: list[tuple[int, bytes]]) -> tuple[np.ndarray, np.ndarray, bytes]:
    """``(ids, lengths, concatenated bytes)`` of a batch of ``(id, bytes)`` samples."""
    ids = np.fromiter((i for i, _ in items), dtype=np.int64, count=len(items))
    lens = np.fromiter((len(b) for _, b in items), dtype=np.int64, count=len(items))
    return ids, lens, b"".join(b for _, b in items)


def sample_loader(ds: PerFileSamples, batches: list[list[int]], workers: int, prefetch: int):
    """A PyTorch ``DataLoader`` over *ds* fed *batches* as its batch sampler, batches
    collated by :func:`collate_samples`; *workers* forked processes, *prefetch* batches
    each."""
    from torch.utils.data import DataLoader

    kw: dict[str, Any] = {"num_workers": workers, "collate_fn": collate_samples}
    if workers > 0:
        kw.update(prefetch_factor=prefetch, multiprocessing_context="fork")
    # torch's stubs want a Dataset subclass; DataLoader takes any map-style dataset
    return DataLoader(ds, batch_sampler=batches, **kw)  # type: ignore[arg-type]


@register_runner("torch")
class TorchRunner(_PeerBase):
    """A PyTorch ``DataLoader`` (``workers`` processes, ``prefetch`` batches each) over
    per-sample reads, fed the rank's steps as its batch sampler."""

    def __init__(self, arg: str | None = None, workers: int = 2, prefetch: int = 2) -> None:
        super().__init__(arg)
        self.workers, self.prefetch = int(workers), int(prefetch)
        self._ds: SampleReads | None = None

    def run(self, ctx: RunContext, rec: DeliveryRecorder) -> RunOutcome:
        try:
            import torch.utils.data  # noqa: F401
        except ImportError as e:
            raise ConfigError("the 'torch' runner needs PyTorch (pip install torch)") from e
        out = RunOutcome()
        self._ds = SampleReads(self._index)
        batches = [s.tolist() for s in self._steps]
        it = iter(sample_loader(self._ds, batches, self.workers, self.prefetch))
        for step in range(len(batches)):
            t0 = time.perf_counter()
            ids, lens, raw = next(it)
            out.exposed_io_s += time.perf_counter() - t0
            out.storage_ops += len(ids)
            out.storage_bytes += len(raw)
            rec.add(step, ids, lens, raw)
            ctx.compute()
        del it
        out.io_s = out.exposed_io_s if self.workers == 0 else float("nan")
        return out

    def close(self) -> None:
        if self._ds is not None:
            self._ds.close()
            self._ds = None
        super().close()


@register_runner("lmdb")
class LmdbCursorRunner:
    """Caffe's LMDB reader: a liblmdb cursor over mmap (py-lmdb) that seeks by walking
    from the first key to the rank's first record, then reads its sub-batches (and walks
    again over whatever the order skips; from the first key when it goes backwards).

    Sample id = position in key order; the raw record is the value. ``seek_s`` is the
    time of the walk.
    """

    def __init__(self, arg: str | None = None) -> None:
        if arg:
            raise ConfigError("lmdb takes no ':argument'")
        self._env: Any = None

    def prepare(self, ctx: RunContext) -> None:
        try:
            import lmdb
        except ImportError as e:
            raise ConfigError("the 'lmdb' runner needs py-lmdb (pip install lmdb)") from e
        path = ctx.source.path
        if os.path.isfile(path):
            path = os.path.dirname(path)
        self._env = lmdb.open(path, readonly=True, lock=False, readahead=True, max_readers=1)
        n = self._env.stat()["entries"]
        self._steps = ctx.my_steps(n)

    def run(self, ctx: RunContext, rec: DeliveryRecorder) -> RunOutcome:
        out = RunOutcome()
        flt0 = _majflt()
        with self._env.begin(buffers=False) as txn:
            cur = txn.cursor()
            cur.first()
            pos = 0
            for step, ids in enumerate(self._steps):
                vals = []
                for i in ids.tolist():
                    if i != pos:  # seek as Caffe's cursor does: walk, never jump
                        t0 = time.perf_counter()
                        if i < pos:
                            cur.first()
                            pos = 0
                        while pos < i:
                            cur.next()
                            pos += 1
                        out.seek_s += time.perf_counter() - t0
                    t0 = time.perf_counter()
                    vals.append(cur.value())
                    cur.next()
                    pos += 1
                    out.io_s += time.perf_counter() - t0
                raw = b"".join(vals)
                out.storage_bytes += len(raw)
                lens = np.fromiter(map(len, vals), dtype=np.int64, count=len(vals))
                rec.add(step, ids, lens, raw)
                ctx.compute()
        out.storage_ops = _majflt() - flt0
        out.exposed_io_s = out.io_s + out.seek_s
        return out

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None


_LOADER_STATS = {
    "io_s": ("io_s", "io_seconds", "read_s"),
    "seek_s": ("seek_s", "seek_seconds", "locate_s"),
    "storage_bytes": ("storage_bytes", "bytes_read", "read_bytes"),
    "storage_ops": ("storage_ops", "read_ops", "ops"),
    "rl": ("rl", "randomization_level"),
}


@register_runner("loader")
class LoaderRunner:
    """``feedline.Loader(ds, batch_size, preset=<arg>, decode=False, comm=comm, epochs=1)``.

    A run reads ``self.epochs`` epochs (one here; subclasses read more), and the Loader
    is told so (``epochs=``, unless the runner's options say otherwise): the ``feedline``
    preset's cost model weighs the DeepIO store's load over them, as it would for a job
    that reads its data that many times, and nothing is read ahead past the last.
    Exposed I/O is the time the consumer waits in ``next()``; seek/io seconds, storage
    bytes/ops and RL come from ``loader.stats()`` when it reports them.
    """

    def __init__(self, arg: str | None = None, **options: Any) -> None:
        self.preset = arg or "feedline"
        self.options = options
        self.epochs = 1
        self._loader: Any = None

    def prepare(self, ctx: RunContext) -> None:
        try:
            from feedline.loader import Loader
        except ImportError as e:
            raise ConfigError(f"runner loader:{self.preset} needs feedline.loader ({e})") from e
        self._Loader = Loader
        self._ds = ctx.source.dataset
        _ = self._ds.index  # index building is the 'index' scenario's business, not ours

    def _open(self, ctx: RunContext) -> Any:
        """The run's Loader (closed by :meth:`close`)."""
        self._loader = self._Loader(
            self._ds,
            ctx.batch_size,
            preset=self.preset,
            seed=ctx.seed,
            comm=ctx.comm,
            decode=False,
            **{"epochs": self.epochs, **self.options},
        )
        return self._loader

    @staticmethod
    def _report(loader: Any, out: RunOutcome) -> None:
        """The figures of ``loader.stats()`` into *out*; every scalar into ``out.extra``."""
        stats = dict(loader.stats() or {})
        for key, names in _LOADER_STATS.items():
            for nm in names:
                if isinstance(stats.get(nm), int | float):
                    setattr(out, key, stats[nm])
                    break
        out.extra = {k: v for k, v in stats.items() if isinstance(v, int | float | str | bool)}

    def run(self, ctx: RunContext, rec: DeliveryRecorder) -> RunOutcome:
        out = RunOutcome()
        loader = self._open(ctx)
        loader.set_epoch(0)
        steps = len(loader) if ctx.steps is None else min(ctx.steps, len(loader))
        it = iter(loader)
        for step in range(steps):
            t0 = time.perf_counter()
            batch = next(it)
            out.exposed_io_s += time.perf_counter() - t0
            rec.add(step, batch.ids, batch.lengths, np.ascontiguousarray(batch.data))
            ctx.compute()
        self._report(loader, out)
        return out

    def close(self) -> None:
        if self._loader is not None:
            self._loader.close()
            self._loader = None
