# SPDX-License-Identifier: Apache-2.0
"""Each peer of ``feedline bench peers`` used the way its users use it.

Every entry of :data:`LOADERS` is a function ``(ctx) -> iterator of id arrays``: it
builds the peer's loader over the copy of the dataset in the peer's own format and
yields, per step, the global ids of the samples this rank received (the copies carry
the id with each sample, so nothing is inferred). The child process
(:mod:`feedline_tools.bench.peer_run`) times the iterator; the functions only set the peer up.

Conversions (:func:`prepare`) are cached next to the LMDB they are made from: each
copy holds, for sample ``i`` in disk order, its id ``i``, its class and the LMDB value
(the Caffe Datum, ~3 KB). Peers whose writer lives in the peer's package (MDS,
LitData) are converted in a child process of the peer's own, before the caches are
dropped.
"""

from __future__ import annotations

import functools
import itertools
import os
import struct
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec

import numpy as np

from feedline.errors import ConfigError

_ID = struct.Struct("<Q")
P = ParamSpec("P")


@dataclass
class PeerContext:
    """What a peer's loop needs on one rank."""

    lmdb: str  # the LMDB directory (the source of every copy)
    cache: str  # where the copies live
    n: int
    classes: int
    batch: int  # this rank's batch
    rank: int
    size: int
    seed: int = 0
    workers: int = 2
    notes: list[str] = field(default_factory=list)

    def copy(self, name: str) -> str:
        return os.path.join(self.cache, name)


def _records(lmdb_dir: str) -> Iterator[tuple[int, bytes]]:
    """(id, value) of the LMDB in key order (the disk order the generator wrote)."""
    import lmdb

    env = lmdb.open(lmdb_dir, readonly=True, lock=False, readahead=True)
    try:
        with env.begin(buffers=False) as txn:
            for i, (_, v) in enumerate(txn.cursor()):
                yield i, v
    finally:
        env.close()


def label_of(ids: np.ndarray, n: int, classes: int) -> np.ndarray:
    """The class of each id: the generator writes class-sorted data (synth.class_of)."""
    from feedline_tools.generate.synth import class_of

    return class_of(ids, n, classes)


# ----------------------------------------------------------------- conversions


def _done(path: str) -> bool:
    return os.path.exists(os.path.join(path, ".complete"))


def _mark(path: str) -> None:
    with open(os.path.join(path, ".complete"), "w") as f:
        f.write("ok\n")


def _cached_copy(
    kind: str, *, mkdir: bool = True
) -> Callable[
    [Callable[Concatenate[PeerContext, str, P], None]], Callable[Concatenate[PeerContext, P], str]
]:
    """``write(ctx, out, ...)`` becomes ``convert(ctx, ...) -> out``: the copy *kind* of
    the LMDB is written into *out* the first time (then marked complete) and found after."""

    def wrap(
        write: Callable[Concatenate[PeerContext, str, P], None],
    ) -> Callable[Concatenate[PeerContext, P], str]:
        @functools.wraps(write)
        def convert(ctx: PeerContext, *args: P.args, **kw: P.kwargs) -> str:
            out = ctx.copy(kind)
            if not _done(out):
                if mkdir:
                    os.makedirs(out, exist_ok=True)
                write(ctx, out, *args, **kw)
                _mark(out)
            return out

        return convert

    return wrap


def _shards(n: int, parts: int) -> list[tuple[int, int]]:
    from feedline.plan.layout import even_split

    return [even_split(n, parts, i) for i in range(parts)]


@_cached_copy("hdf5")
def convert_hdf5(ctx: PeerContext, out: str) -> None:
    """One HDF5 file: ``data`` (n, L) uint8 Datums, ``ids`` and ``labels``."""
    import h5py

    vals = [v for _, v in _records(ctx.lmdb)]
    width = max(len(v) for v in vals)
    if any(len(v) != width for v in vals):
        raise ConfigError("the hdf5 copy needs fixed-length records")
    arr = np.frombuffer(b"".join(vals), dtype=np.uint8).reshape(len(vals), width)
    ids = np.arange(len(vals), dtype=np.int64)
    with h5py.File(os.path.join(out, "data.h5"), "w") as f:
        f.create_dataset("data", data=arr)
        f.create_dataset("ids", data=ids)
        f.create_dataset("labels", data=label_of(ids, ctx.n, ctx.classes))


@_cached_copy("tfrecord")
def convert_tfrecord(ctx: PeerContext, out: str, files: int = 16) -> None:
    """TFRecord shards whose payload is the id (u64 LE) followed by the Datum."""
    from feedline.formats.tfrecord import frames

    vals = [v for _, v in _records(ctx.lmdb)]
    for k, (lo, hi) in enumerate(_shards(len(vals), files)):
        with open(os.path.join(out, f"train-{k:05d}.tfrecord"), "wb") as f:
            for a in range(lo, hi, 4096):
                b = min(hi, a + 4096)
                f.write(frames([_ID.pack(i) + vals[i] for i in range(a, b)]))


@_cached_copy("wds")
def convert_wds(ctx: PeerContext, out: str, shards: int = 16) -> None:
    """WebDataset tar shards: ``{id:09d}.bin`` (the Datum) and ``.cls`` per sample."""
    vals = [v for _, v in _records(ctx.lmdb)]
    labels = label_of(np.arange(len(vals)), ctx.n, ctx.classes)
    import io

    for k, (lo, hi) in enumerate(_shards(len(vals), shards)):
        with tarfile.open(os.path.join(out, f"shard-{k:05d}.tar"), "w") as tar:
            for i in range(lo, hi):
                for ext, data in (("bin", vals[i]), ("cls", str(int(labels[i])).encode())):
                    info = tarfile.TarInfo(f"{i:09d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def import_streaming(notes: list[str] | None = None) -> Any:
    """``import streaming``, working around a torchvision that cannot load.

    Mosaic's package imports ``streaming.vision``, which imports torchvision at module
    level; where torchvision is installed but broken (here: its C++ ops do not load
    against torch 2.13 CPU, "operator torchvision::nms does not exist"), the two names
    ``streaming.vision`` needs are stubbed. The bench uses ``StreamingDataset`` and
    ``MDSWriter`` only, which never touch them; the note says so in the report.
    """
    import sys
    import types

    try:
        import streaming

        return streaming
    except (RuntimeError, ImportError) as e:
        if "torchvision" not in repr(e) and "torchvision" not in str(getattr(e, "name", "")):
            raise
        why = str(e).splitlines()[-1][:120]
    for k in [
        k for k in sys.modules if k == "torchvision" or k.startswith(("torchvision.", "streaming"))
    ]:
        del sys.modules[k]
    tv = types.ModuleType("torchvision")
    ds, tr, fn = (
        types.ModuleType(f"torchvision.{m}")
        for m in ("datasets", "transforms", "transforms.functional")
    )
    vars(ds).update(VisionDataset=object, CIFAR10=object)
    vars(fn).update(to_tensor=lambda x: x)
    vars(tv).update(datasets=ds, transforms=tr)
    vars(tr).update(functional=fn)
    sys.modules.update(
        {
            "torchvision": tv,
            "torchvision.datasets": ds,
            "torchvision.transforms": tr,
            "torchvision.transforms.functional": fn,
        }
    )
    import streaming

    if notes is not None:
        notes.append(
            f"workaround: torchvision fails to import here ({why}); stubbed for "
            "streaming.vision, which the bench does not use"
        )
    return streaming


@_cached_copy("mds", mkdir=False)
def convert_mds(ctx: PeerContext, out: str) -> None:
    """MosaicML Streaming MDS shards written with its ``MDSWriter``."""
    MDSWriter = import_streaming().MDSWriter

    cols = {"id": "int64", "label": "int64", "x": "bytes"}
    labels = label_of(np.arange(ctx.n), ctx.n, ctx.classes)
    with MDSWriter(out=out, columns=cols, size_limit=1 << 26) as w:
        for i, v in _records(ctx.lmdb):
            w.write({"id": i, "label": int(labels[i]), "x": v})


class _LitItem:
    """``optimize``'s fn: sample i of the LMDB as a dict (picklable; litdata spawns)."""

    def __init__(self, path: str, n: int, classes: int) -> None:
        self.path, self.n, self.classes = path, n, classes
        self._vals: list[bytes] | None = None

    def __call__(self, i: int) -> dict[str, Any]:
        if self._vals is None:
            self._vals = [v for _, v in _records(self.path)]
        return {
            "id": i,
            "label": int(label_of(np.array([i]), self.n, self.classes)[0]),
            "x": self._vals[i],
        }


@_cached_copy("litdata", mkdir=False)
def convert_litdata(ctx: PeerContext, out: str) -> None:
    """LitData chunks written by ``litdata.optimize`` (one worker, 64 MB chunks)."""
    import litdata

    litdata.optimize(
        fn=_LitItem(ctx.lmdb, ctx.n, ctx.classes),
        inputs=list(range(ctx.n)),
        output_dir=out,
        chunk_bytes="64MB",
        num_workers=1,
        mode="overwrite",
    )


# -------------------------------------------------------------------- peers


def _env_dist(ctx: PeerContext, port: int = 0) -> None:
    """What ``torchrun`` gives Mosaic and LitData: the torch.distributed variables and,
    for more than one process, an initialised (gloo) process group."""
    os.environ.update(
        RANK=str(ctx.rank),
        WORLD_SIZE=str(ctx.size),
        LOCAL_RANK=str(ctx.rank),
        LOCAL_WORLD_SIZE=str(ctx.size),
        NODE_RANK="0",
    )
    if ctx.size > 1 and port:
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        if not dist.is_initialized():
            dist.init_process_group("gloo", rank=ctx.rank, world_size=ctx.size)


class LmdbMap:
    """Map-style dataset over py-lmdb as its users write it: the environment opened
    lazily in each worker, ``txn.get(key)`` per sample; ``batched`` adds
    ``__getitems__`` (one transaction, ``getmulti`` over the batch's keys)."""

    def __init__(self, path: str, batched: bool) -> None:
        import lmdb

        self.path = path
        self._env = None
        env = lmdb.open(path, readonly=True, lock=False)
        with env.begin() as txn:
            self.keys = [k for k, _ in txn.cursor()]
        env.close()
        if batched:
            self.__getitems__ = self._getitems

    def __getstate__(self):
        d = self.__dict__.copy()
        d["_env"] = None
        d.pop("__getitems__", None)
        d["_batched"] = "__getitems__" in self.__dict__
        return d

    def __setstate__(self, d):
        batched = d.pop("_batched", False)
        self.__dict__.update(d)
        if batched:
            self.__getitems__ = self._getitems

    def env(self):
        if self._env is None:
            import lmdb

            self._env = lmdb.open(self.path, readonly=True, lock=False, readahead=False)
        return self._env

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> tuple[int, bytes]:
        with self.env().begin() as txn:
            return i, txn.get(self.keys[i])

    def _getitems(self, idx: list[int]) -> list[tuple[int, bytes]]:
        with self.env().begin() as txn:
            vals = txn.cursor().getmulti([self.keys[i] for i in idx])
        return [(i, v) for i, (_, v) in zip(idx, vals, strict=True)]


class H5Map:
    """Map-style dataset over h5py, the file opened lazily in each worker."""

    def __init__(self, path: str) -> None:
        import h5py

        self.path = path
        self._f: Any = None  # the h5py.File, opened in each worker
        with h5py.File(path, "r") as f:
            self.n = len(f["ids"])

    def __getstate__(self):
        return dict(self.__dict__, _f=None)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, Any]:
        if self._f is None:
            import h5py

            self._f = h5py.File(self.path, "r")
        return int(self._f["ids"][i]), self._f["data"][i]


def _ids_collate(items: list[tuple[int, Any]]) -> np.ndarray:
    return np.fromiter((i for i, _ in items), dtype=np.int64, count=len(items))


def _torch_loop(ctx: PeerContext, ds: Any, workers: int) -> Iterator[np.ndarray]:
    from torch.utils.data import DataLoader, DistributedSampler

    sampler: DistributedSampler[Any] = DistributedSampler(
        ds, num_replicas=ctx.size, rank=ctx.rank, shuffle=True, seed=ctx.seed
    )
    sampler.set_epoch(0)
    kw: dict[str, Any] = {}
    if workers:
        kw = {"num_workers": workers, "prefetch_factor": 2, "persistent_workers": False}
    dl = DataLoader(ds, batch_size=ctx.batch, sampler=sampler, collate_fn=_ids_collate, **kw)
    ctx.notes.append(
        f"DataLoader(batch_size={ctx.batch}, DistributedSampler(shuffle=True), "
        f"num_workers={workers})"
    )
    yield from dl


def torch_lmdb(workers: int, batched: bool) -> Callable[[PeerContext], Iterator[np.ndarray]]:
    def loop(ctx: PeerContext) -> Iterator[np.ndarray]:
        ds = LmdbMap(ctx.lmdb, batched)
        ctx.notes.append(
            "py-lmdb txn.get per sample" + (", __getitems__ -> getmulti" if batched else "")
        )
        yield from _torch_loop(ctx, ds, workers)

    return loop


def torch_h5(workers: int) -> Callable[[PeerContext], Iterator[np.ndarray]]:
    def loop(ctx: PeerContext) -> Iterator[np.ndarray]:
        ds = H5Map(os.path.join(convert_hdf5(ctx), "data.h5"))
        ctx.notes.append("h5py dataset[i] per sample")
        yield from _torch_loop(ctx, ds, workers)

    return loop


def _mds_ids(xs: list[dict[str, Any]]) -> np.ndarray:
    return np.fromiter((x["id"] for x in xs), np.int64, len(xs))


def mosaic(ctx: PeerContext) -> Iterator[np.ndarray]:
    _env_dist(ctx)
    from torch.utils.data import DataLoader

    StreamingDataset = import_streaming(ctx.notes).StreamingDataset

    ds = StreamingDataset(
        local=convert_mds(ctx), shuffle=True, shuffle_seed=ctx.seed + 1, batch_size=ctx.batch
    )
    ctx.notes.append(
        f"StreamingDataset(local=MDS, shuffle=True [default algo], batch_size={ctx.batch}), "
        f"DataLoader(num_workers={ctx.workers})"
    )
    dl = DataLoader(ds, batch_size=ctx.batch, num_workers=ctx.workers, collate_fn=_mds_ids)
    yield from dl


def _wds_ids(batch: Any) -> np.ndarray:
    keys = batch["__key__"] if isinstance(batch, dict) else batch[0]
    return np.asarray([int(k) for k in keys], dtype=np.int64)


def webdataset(ctx: PeerContext) -> Iterator[np.ndarray]:
    import webdataset as wds

    out = convert_wds(ctx)
    urls = sorted(os.path.join(out, f) for f in os.listdir(out) if f.endswith(".tar"))
    buf = 5000
    ds = (
        wds.WebDataset(
            urls,
            shardshuffle=len(urls),
            nodesplitter=lambda u: itertools.islice(u, ctx.rank, None, ctx.size),
            seed=ctx.seed,
            empty_check=False,
        )
        .shuffle(buf)
        .batched(ctx.batch, partial=True)
    )
    ctx.notes.append(
        f"WebDataset({len(urls)} tar shards, shardshuffle, split by node) .shuffle({buf}) "
        f".batched({ctx.batch}); WebLoader(num_workers={ctx.workers})"
    )
    dl = wds.WebLoader(ds, batch_size=None, num_workers=ctx.workers)
    for b in dl:
        yield _wds_ids(b)


def litdata_loop(ctx: PeerContext) -> Iterator[np.ndarray]:
    _env_dist(ctx)
    import litdata

    ds = litdata.StreamingDataset(convert_litdata(ctx), shuffle=True, seed=ctx.seed)
    # ids only: torch's default_collate turns each 3 KB bytes value into a tensor of ints
    # (~2 s per batch), a cost no user would keep; the other peers collate ids alone too
    dl = litdata.StreamingDataLoader(
        ds, batch_size=ctx.batch, num_workers=ctx.workers, collate_fn=_mds_ids
    )
    ctx.notes.append(
        f"optimize(64 MB chunks) + StreamingDataset(shuffle=True), "
        f"StreamingDataLoader(num_workers={ctx.workers}, collate of ids)"
    )
    for b in dl:
        yield np.asarray(b, dtype=np.int64).reshape(-1)


def tfdata(ctx: PeerContext) -> Iterator[np.ndarray]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    out = convert_tfrecord(ctx)
    files = sorted(os.path.join(out, f) for f in os.listdir(out) if f.endswith(".tfrecord"))
    buf = 10_000
    ds = tf.data.Dataset.from_tensor_slices(files).shard(ctx.size, ctx.rank)
    ds = ds.shuffle(len(files), seed=ctx.seed).interleave(
        tf.data.TFRecordDataset,
        cycle_length=4,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False,
    )
    ds = ds.shuffle(buf, seed=ctx.seed).batch(ctx.batch).prefetch(tf.data.AUTOTUNE)
    ds = ds.map(lambda r: tf.io.decode_raw(tf.strings.substr(r, 0, 8), tf.int64))
    ctx.notes.append(
        f"TFRecordDataset files sharded by rank, interleave(cycle 4, AUTOTUNE), "
        f"shuffle({buf}), batch({ctx.batch}), prefetch(AUTOTUNE)"
    )
    for b in ds:
        yield b.numpy().reshape(-1).astype(np.int64)


def feedline_loop(preset: str, fmt: str) -> Callable[[PeerContext], Iterator[np.ndarray]]:
    def loop(ctx: PeerContext) -> Iterator[np.ndarray]:
        from feedline import Loader, open_dataset
        from feedline_tools.bench.worker import world_comm

        path = ctx.lmdb if fmt == "lmdb" else convert_tfrecord(ctx)
        comm = world_comm()
        ds = open_dataset(path, comm=comm, progress=False)
        loader = Loader(
            ds, ctx.batch * ctx.size, preset=preset, seed=ctx.seed, comm=comm, decode=False
        )
        loader.set_epoch(0)
        ctx.notes.append(f"feedline.Loader(preset={preset!r}, decode=False) on the {fmt} copy")
        try:
            for b in loader:
                yield np.asarray(b.ids, dtype=np.int64)
            st = loader.stats() or {}
            ctx.notes.append(f"source={st.get('source', '?')}")
        finally:
            loader.close()

    return loop


#: name -> (package the peer needs, what it is, the loop)
LOADERS: dict[str, tuple[str | None, str, Callable[[PeerContext], Iterator[np.ndarray]]]] = {
    "torch-lmdb": ("torch", "torch DataLoader, py-lmdb, 0 workers", torch_lmdb(0, False)),
    "torch-lmdb-w2": ("torch", "torch DataLoader, py-lmdb, 2 workers", torch_lmdb(2, False)),
    "torch-lmdb-getitems": (
        "torch",
        "torch DataLoader, py-lmdb, __getitems__, 0 workers",
        torch_lmdb(0, True),
    ),
    "torch-lmdb-getitems-w2": (
        "torch",
        "torch DataLoader, py-lmdb, __getitems__, 2 workers",
        torch_lmdb(2, True),
    ),
    "torch-h5py": ("torch", "torch DataLoader, h5py, 0 workers", torch_h5(0)),
    "torch-h5py-w2": ("torch", "torch DataLoader, h5py, 2 workers", torch_h5(2)),
    "mosaic": ("streaming", "MosaicML Streaming, MDS shards", mosaic),
    "webdataset": ("webdataset", "WebDataset, tar shards + shuffle buffer", webdataset),
    "litdata": ("litdata", "LitData optimize + StreamingDataset", litdata_loop),
    "tf.data": ("tensorflow", "tf.data over TFRecord", tfdata),
    "feedline": (None, "feedline default preset, LMDB", feedline_loop("feedline", "lmdb")),
    "async-db": (None, "feedline async-db preset, LMDB", feedline_loop("async-db", "lmdb")),
    "feedline-tfrecord": (
        None,
        "feedline default preset, TFRecord copy",
        feedline_loop("feedline", "tfrecord"),
    ),
    "async-db-tfrecord": (
        None,
        "feedline async-db preset, TFRecord copy",
        feedline_loop("async-db", "tfrecord"),
    ),
}

#: the copy (directory under the cache) each loader reads, and its converter
COPIES: dict[str, tuple[str, Callable[[PeerContext], str] | None]] = {
    "torch-h5py": ("hdf5", convert_hdf5),
    "torch-h5py-w2": ("hdf5", convert_hdf5),
    "mosaic": ("mds", convert_mds),
    "webdataset": ("wds", convert_wds),
    "litdata": ("litdata", convert_litdata),
    "tf.data": ("tfrecord", convert_tfrecord),
    "feedline-tfrecord": ("tfrecord", convert_tfrecord),
    "async-db-tfrecord": ("tfrecord", convert_tfrecord),
}


def prepare(name: str, ctx: PeerContext) -> str:
    """Make (or find cached) the copy *name* reads; return the directory it reads."""
    copy = COPIES.get(name)
    path = ctx.lmdb if copy is None else (copy[1](ctx) if copy[1] else ctx.copy(copy[0]))
    if LOADERS[name][0] is None:  # feedline's own conversion: its index sidecar
        from feedline import open_dataset

        open_dataset(path, progress=False).index  # noqa: B018 - built and cached
    return path


def missing_package(name: str) -> str | None:
    """The package *name* needs that is not installed here, or None."""
    import importlib.util

    pkg = LOADERS[name][0]
    if pkg is None:
        return None
    return None if importlib.util.find_spec(pkg) is not None else pkg
