# SPDX-License-Identifier: Apache-2.0
"""DeepIO's portable API (§III-D): seeds in a file, per-worker index arrays, batches read
through a storage backend.

    from feedline import deepio
    deepio.generate_seed(10, "seeds.json")                      # once, before training
    ids = deepio.shuffle_rand(epoch, worker, "seeds.json", n=len(ds), workers=P,
                              batch_size=B)                     # this worker's order
    for mb in deepio.batch(ids, B // P, dataset=ds, backend="native"):
        train(mb.data, mb.ids)

* :func:`generate_seed` writes the seed of every epoch to a small JSON file, so that
  every worker derives the same orders without a broadcast (the paper's seed file).
* :func:`shuffle_rand` is the worker's share of the epoch's order: exactly what the
  ``deepio-<mode>`` Loader delivers to rank ``worker`` of ``workers`` with that seed
  and epoch (:func:`feedline.plan.make_plan`; R, the opportunistic mode and nodes
  included), so the API and the in-memory store agree sample for sample.
* :func:`batch` reads mini-batches of those ids through a backend of
  :mod:`feedline.io.backend` (``init``/``read``: ``files`` is plain POSIX ``pread``,
  ``native`` feedline's C++ engine): within a batch the records are sorted by place,
  cut into backend calls of ``count_per_read`` records, and adjacent ones merged. The
  fixed-size case of the paper (``element_size`` + ``dataset_filename_list``: elements
  back to back in the files) needs no index; a feedline :class:`~feedline.Dataset`
  brings its own (variable lengths too).

The API reads from storage every epoch (the paper's API is the frontend of the store:
what the store serves from memory, ``Loader(preset="deepio-ordered")`` does, same order).
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ConfigError, StateError

_FORMAT = "feedline-deepio-seeds/1"


def generate_seed(
    epoch_count: int, seed_file: str | os.PathLike[str], *, seed: int | None = None
) -> list[int]:
    """Write *epoch_count* seeds to *seed_file* (JSON, atomically) and return them.

    With *seed* the list is a pure function of it (reproducible runs); without, it is
    random. Run it once (one rank) before the workers call :func:`shuffle_rand`.
    """
    if int(epoch_count) < 1:
        raise ConfigError(f"epoch_count must be >= 1, got {epoch_count}")
    rng = np.random.default_rng(secrets.randbits(63) if seed is None else int(seed))
    seeds = [int(x) for x in rng.integers(0, 1 << 62, int(epoch_count), dtype=np.int64)]
    path = os.fspath(seed_file)
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".seeds-", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"format": _FORMAT, "seeds": seeds}, f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return seeds


def read_seeds(seed_file: str | os.PathLike[str]) -> list[int]:
    """The seeds of *seed_file* (:class:`~feedline.errors.StateError` when it is not one)."""
    path = os.fspath(seed_file)
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        raise StateError(f"{path}: not a readable seed file ({e})") from e
    if not isinstance(d, dict) or d.get("format") != _FORMAT:
        raise StateError(f"{path}: not a feedline seed file (format {_FORMAT!r} expected)")
    seeds = d.get("seeds")
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and s >= 0 for s in seeds)
    ):
        raise StateError(f"{path}: the seed list is damaged")
    return seeds


def shuffle_rand(
    epoch_id: int,
    worker_id: int,
    seed_file: str | os.PathLike[str],
    *,
    n: int,
    workers: int = 1,
    batch_size: int | None = None,
    memory_fraction: float = 1.0,
    mode: str = "ordered",
    nodes: int = 1,
) -> np.ndarray:
    """Worker *worker_id*'s sample ids for epoch *epoch_id*, in the order to read them.

    Parameters
    ----------
    n : int
        Samples in the dataset.
    workers, nodes : int
        The job: P workers on M nodes (the opportunistic order depends on them).
    batch_size : int, optional
        The global batch B; the worker's ids are its sub-batches of every step, one
        after the other (batch them by its share, ``B // workers``). Default: one step of
        n (the worker gets a contiguous 1/P of the epoch's order).
    memory_fraction, mode : float, str
        DeepIO's R and ``ordered`` / ``opportunistic``, as the ``deepio-*`` presets.

    Returns
    -------
    numpy.ndarray of int64
    """
    from .plan import WorldSpec, get_strategy, make_plan

    seeds = read_seeds(seed_file)
    if not 0 <= int(epoch_id) < len(seeds):
        raise ConfigError(f"epoch {epoch_id} outside the seed file's {len(seeds)} epochs")
    if not 0 <= int(worker_id) < int(workers):
        raise ConfigError(f"worker {worker_id} outside [0, {workers})")
    if mode not in ("ordered", "opportunistic"):
        raise ConfigError(f"mode must be ordered or opportunistic, not {mode!r}")
    strategy = get_strategy(f"deepio-{mode}", memory_fraction=memory_fraction)
    plan = make_plan(
        int(n),
        WorldSpec(int(workers), int(nodes)),
        strategy,
        seeds[int(epoch_id)],
        int(epoch_id),
        int(batch_size or max(int(n), 1)),
    )
    return plan.rank_samples(int(worker_id))[0]


@dataclass
class MiniBatch:
    """One mini-batch: sample ids, their bytes (``(B, element_size)`` for fixed-size
    elements, else concatenated) and lengths."""

    ids: np.ndarray
    data: np.ndarray
    lengths: np.ndarray


class Batches:
    """The iterator :func:`batch` returns (``close()`` releases the backend)."""

    def __init__(self, ids, batch_size, extents, files, backend, count_per_read, fixed, drop_last):
        from .io.backend import backend as make_backend

        self._ids = np.asarray(ids, dtype=np.int64)
        self._B = int(batch_size)
        self._fid, self._off, self._len = extents
        self._count = int(count_per_read)
        self._fixed = fixed
        self._drop = drop_last
        self._backend = make_backend(backend) if isinstance(backend, str) else backend
        self._backend.init(files)
        self.read_calls = 0

    def __len__(self) -> int:
        n = len(self._ids)
        return n // self._B if self._drop else -(-n // self._B)

    def __iter__(self) -> Iterator[MiniBatch]:
        from . import _core
        from .pipeline.reader import coalesce

        try:
            for s in range(len(self)):
                ids = self._ids[s * self._B : (s + 1) * self._B]
                ln = self._len[ids]
                dest = np.zeros(len(ids), dtype=np.int64)
                np.cumsum(ln[:-1], out=dest[1:])
                out = np.empty(int(ln.sum()), dtype=np.uint8)
                order = np.lexsort((self._off[ids], self._fid[ids]))
                for lo in range(0, len(order), self._count):
                    part = order[lo : lo + self._count]
                    sel = ids[part]
                    c = coalesce(self._fid[sel], self._off[sel], self._len[sel], gap=0)
                    buf = np.empty(int(c.reads.lengths.sum()), dtype=np.uint8)
                    self._backend.read((c.reads.file_ids, c.reads.offsets, c.reads.lengths), buf)
                    self.read_calls += 1
                    _core.copy_records(buf, c.src, self._len[sel], out, dest[part])
                data = out.reshape(len(ids), self._fixed) if self._fixed else out
                yield MiniBatch(ids, data, ln)
        finally:
            self.close()

    def close(self) -> None:
        self._backend.close()


def batch(
    index_array: Any,
    batch_size: int,
    element_size: int | None = None,
    count_per_read: int = 64,
    dataset_filename_list: Sequence[str | os.PathLike[str]] | None = None,
    *,
    dataset: Any = None,
    backend: Any = "native",
    drop_last: bool = False,
) -> Batches:
    """Mini-batches of *batch_size* of the ids in *index_array*, read through *backend*.

    Parameters
    ----------
    index_array : array of int
        Sample ids in order (:func:`shuffle_rand`).
    batch_size : int
        Samples per mini-batch (this worker's).
    element_size, dataset_filename_list
        The paper's fixed-size layout: element i is the i-th run of *element_size* bytes
        of the files taken back to back (a file's tail shorter than an element is
        ignored).
    count_per_read : int
        Records per backend ``read`` call (sorted by place; adjacent ones merged).
    dataset : feedline Dataset or path, optional
        Instead of the fixed-size layout: a dataset with its index.
    backend : str or StorageBackend
        ``native`` (feedline's engine), ``files`` (plain pread), or an object with
        ``init(files)``/``read(extents, buffer)``/``close()``.

    Returns
    -------
    Batches
        Iterable of :class:`MiniBatch`.
    """
    if int(batch_size) < 1 or int(count_per_read) < 1:
        raise ConfigError("batch_size and count_per_read must be >= 1")
    ids = np.asarray(index_array, dtype=np.int64).reshape(-1)
    if dataset is not None:
        if not hasattr(dataset, "index"):
            from .dataset import open_dataset

            dataset = open_dataset(dataset)
        idx = dataset.index
        files = list(dataset.files)
        extents = (np.asarray(idx.file_ids, np.int64), idx.offsets, idx.lengths)
        fixed = idx.fixed_length if hasattr(idx, "fixed_length") else None
    else:
        if element_size is None or not dataset_filename_list:
            raise ConfigError("batch needs dataset= or element_size and dataset_filename_list")
        L = int(element_size)
        if L < 1:
            raise ConfigError(f"element_size must be >= 1, got {element_size}")
        files = [os.fspath(f) for f in dataset_filename_list]
        per = [os.path.getsize(f) // L for f in files]
        fid = np.repeat(np.arange(len(files), dtype=np.int64), per)
        first = np.repeat(np.cumsum([0, *per[:-1]]), per)
        off = (np.arange(len(fid), dtype=np.int64) - first) * L
        extents = (fid, off, np.full(len(fid), L, dtype=np.int64))
        fixed = L
    n = len(extents[0])
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= n):
        raise ConfigError(f"index_array holds ids outside [0, {n}) (the dataset's samples)")
    return Batches(ids, batch_size, extents, files, backend, count_per_read, fixed, drop_last)


__all__ = ["Batches", "MiniBatch", "batch", "generate_seed", "read_seeds", "shuffle_rand"]
