# SPDX-License-Identifier: Apache-2.0
"""Writers: synthetic samples into LMDB, HDF5, binary records, TFRecord and npy files.

Each writer takes a :class:`Job` (output directory, sample count, seed, the canonical id
at every position, options, progress bar), writes position by position in batches of a
few MiB, and returns facts for the manifest. Formats are written the way their usual
producers write them (Caffe's ``convert_imageset`` for LMDB, h5py contiguous datasets,
TensorFlow's TFRecord framing), because feedline's indexers and baselines are measured
on files shaped like real ones.
"""

from __future__ import annotations

import io
import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from feedline.errors import ConfigError
from feedline.formats.datum_write import datum_prefix, encode_datum, label_suffix, varint
from feedline.plan.layout import floor_start
from feedline_tools.generate.synth import CosmoSynth, ImageSynth, NeuronSynth, class_of

_BATCH_BYTES = 8 << 20  # synthesise ~8 MiB per batch: vectorised, yet small in memory
_MiB = 1 << 20


@dataclass
class Job:
    """One generation run, as writers see it."""

    name: str
    out: str
    n: int
    seed: int
    order: np.ndarray
    opts: dict[str, Any]
    bar: Any
    facts: dict[str, Any] = field(default_factory=dict)

    def batches(
        self, sample_bytes: int, lo: int = 0, hi: int | None = None
    ) -> Iterator[tuple[int, int]]:
        """``(start, stop)`` position ranges covering [lo, hi) in ~8 MiB batches."""
        hi = self.n if hi is None else hi
        per = max(1, min(4096, _BATCH_BYTES // max(1, sample_bytes)))
        for a in range(lo, hi, per):
            yield a, min(hi, a + per)

    def images(self, synth: ImageSynth, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Images and labels at positions [a, b)."""
        ids = self.order[a:b]
        labels = class_of(ids, self.n, synth.classes)
        return synth.batch(ids, labels), labels


def _image_synth(job: Job) -> ImageSynth:
    o = job.opts
    return ImageSynth((o["channels"], o["image_size"], o["image_size"]), o["classes"], job.seed)


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous position ranges for *parts* files, sizes differing by at most one."""
    if parts < 1:
        raise ConfigError(f"files must be >= 1, got {parts}")
    if parts > n:
        raise ConfigError(f"cannot split {n} samples into {parts} files (files must be <= samples)")
    edges = [floor_start(n, parts, i) for i in range(parts + 1)]
    return list(itertools.pairwise(edges))


def _image_facts(job: Job, synth: ImageSynth) -> dict[str, Any]:
    return {
        "sample_shape": list(synth.shape),
        "dtype": "uint8",
        "layout": "CHW",
        "classes": synth.classes,
        "label_dtype": "int64",
    }


# ---------------------------------------------------------------------------- LMDB


def _jpeg(img: np.ndarray, quality: int) -> bytes:
    from PIL import Image

    pic = Image.fromarray(
        img[0] if img.shape[0] == 1 else np.ascontiguousarray(img.transpose(1, 2, 0))
    )
    buf = io.BytesIO()
    pic.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def _commit(env: Any, pending: list[tuple[bytes, bytes]]) -> None:
    """One write transaction of *pending*; on MDB_MAP_FULL double the map and redo it.

    Caffe's LMDB writer does the same (abort, double ``map_size``, replay the batch), so
    a map that is too small costs time, never data.
    """
    import lmdb

    while True:
        try:
            with env.begin(write=True) as txn:
                for key, val in pending:
                    txn.put(key, val)
            return
        except lmdb.MapFullError:
            env.set_mapsize(int(env.info()["map_size"]) * 2)


def write_lmdb(job: Job) -> dict[str, Any]:
    """Caffe ``Datum`` records in an LMDB, keys ``%08d``, a commit every N records."""
    import lmdb

    o = job.opts
    commit_every = int(o["commit_every"])
    if commit_every < 1:
        raise ConfigError(f"commit_every must be >= 1, got {commit_every}")
    synth = _image_synth(job)
    c, h, w = synth.shape
    encoded = bool(o["encoded"])
    quality = int(o["quality"])
    if encoded and c not in (1, 3):
        raise ConfigError(f"--encoded JPEG Datums need 1 or 3 channels, not {c}")
    prefix = datum_prefix(c, h, w)
    suffixes = [label_suffix(k) for k in range(min(synth.classes, 1 << 14))]
    # sync off while writing (one fsync at the end): durability, not layout, changes
    env = lmdb.open(
        job.out,
        map_size=int(o["map_size"]),
        subdir=True,
        sync=False,
        metasync=False,
        readahead=False,
        meminit=True,
        max_dbs=0,
    )
    commits = 0
    lo_size, hi_size = 1 << 62, 0  # running extremes: no per-record array at 50 M records
    try:
        pending: list[tuple[bytes, bytes]] = []
        for a, b in job.batches(synth.nbytes):
            imgs, labels = job.images(synth, a, b)
            for k in range(b - a):
                lab = int(labels[k])
                if encoded:
                    val = encode_datum(0, 0, 0, _jpeg(imgs[k], quality), lab, encoded=True)
                else:
                    val = prefix + imgs[k].tobytes() + suffixes[lab]
                lo_size, hi_size = min(lo_size, len(val)), max(hi_size, len(val))
                pending.append((b"%08d" % (a + k), val))
                if len(pending) == commit_every:
                    _commit(env, pending)
                    commits += 1
                    pending = []
            job.bar.update(b - a)
        if pending:
            _commit(env, pending)
            commits += 1
        env.sync(True)
        stat = env.stat()
        info = env.info()
    finally:
        env.close()
    facts = _image_facts(job, synth)
    facts.update(
        format="lmdb",
        files=["data.mdb"],
        open_options={},
        record="Caffe Datum" + (" (encoded JPEG)" if encoded else ""),
        record_bytes_min=lo_size,
        record_bytes_max=hi_size,
        provenance={
            # LMDBIO §4.4: what a seek-free reader needs to recompute record offsets
            "writer": "py-lmdb "
            + lmdb.__version__
            + ", liblmdb "
            + ".".join(map(str, lmdb.version())),
            "commit_every": commit_every,
            "commits": commits,
            "key_format": "%08d",
            "insertion_order": "ascending keys, one put per record, no MDB_APPEND",
            "page_size": int(stat["psize"]),
            "depth": int(stat["depth"]),
            "branch_pages": int(stat["branch_pages"]),
            "leaf_pages": int(stat["leaf_pages"]),
            "overflow_pages": int(stat["overflow_pages"]),
            "entries": int(stat["entries"]),
            "map_size": int(info["map_size"]),
            "last_txnid": int(info["last_txnid"]),
            "last_pgno": int(info["last_pgno"]),
        },
    )
    return facts


# ---------------------------------------------------------------------------- HDF5


def _write_hdf5(job: Job, synth: Any, prefix: str, paper: str) -> dict[str, Any]:
    import h5py

    files = []
    split = list(_split(job.n, int(job.opts["files"])))
    # one chunk shape for every file (feedline refuses a dataset whose files differ),
    # no larger than the smallest file (HDF5 refuses chunks larger than the dataset)
    rows = min((hi - lo for lo, hi in split), default=1)
    for f_i, (lo, hi) in enumerate(split):
        name = f"{prefix}-{f_i:04d}.h5"
        with h5py.File(os.path.join(job.out, name), "w") as h5:
            # default: no chunks, no filters (contiguous, one (offset, length) per sample);
            # --compression: chunks of --chunk-samples whole samples, filtered
            x = h5.create_dataset(
                "x",
                shape=(hi - lo, *synth.shape),
                dtype=synth.dtype,
                **_h5_filters(job, synth, rows),
            )
            y = h5.create_dataset("y", shape=(hi - lo, synth.n_targets), dtype="<f4")
            h5.attrs["generator"] = job.name
            h5.attrs["mimics"] = paper
            for a, b in job.batches(synth.nbytes, lo, hi):
                data, targets = synth.batch(job.order[a:b])
                x[a - lo : b - lo] = data
                y[a - lo : b - lo] = targets
                job.bar.update(b - a)
        files.append(name)
    return {
        "format": "hdf5",
        "files": files,
        "compression": job.opts.get("compression", "none"),
        "open_options": {"dataset": "x", "labels": "y"},
        "sample_shape": list(synth.shape),
        "dtype": np.dtype(synth.dtype).name,
        "targets": synth.n_targets,
        "label_dtype": "float32",
        "record_bytes_min": synth.nbytes,
        "record_bytes_max": synth.nbytes,
    }


#: --compression of the HDF5 generators -> h5py create_dataset keywords
H5_COMPRESSION: dict[str, dict[str, Any]] = {
    "none": {},
    "gzip": {"compression": "gzip", "compression_opts": 4},
    "gzip-shuffle": {"compression": "gzip", "compression_opts": 4, "shuffle": True},
    "lzf": {"compression": "lzf"},
    "lzf-shuffle": {"compression": "lzf", "shuffle": True},
}


def _h5_filters(job: Job, synth: Any, rows: int) -> dict[str, Any]:
    comp = job.opts.get("compression", "none")
    if comp not in H5_COMPRESSION:
        raise ConfigError(f"compression must be one of {list(H5_COMPRESSION)}, not {comp!r}")
    if comp == "none":
        return {}
    c = int(job.opts.get("chunk_samples", 16))
    if c < 1:
        raise ConfigError(f"chunk_samples must be >= 1, not {c}")
    # at most *rows* (the smallest file's samples): HDF5 refuses larger chunks
    return {"chunks": (max(1, min(c, rows)), *synth.shape), **H5_COMPRESSION[comp]}


class _Cosmo(CosmoSynth):
    dtype = np.dtype("<u2")
    n_targets = CosmoSynth.TARGETS


class _Neuron(NeuronSynth):
    dtype = np.dtype("<f4")


def write_cosmoflow(job: Job) -> dict[str, Any]:
    """CosmoFlow-like HDF5 files: (n, side, side, side, channels) uint16 + (n, 4) float32."""
    o = job.opts
    if int(o["cube"]) < 1 or int(o["channels"]) < 1:
        raise ConfigError("cube and channels must be >= 1")
    synth = _Cosmo(int(o["cube"]), int(o["channels"]), job.seed, job.n)
    facts = _write_hdf5(
        job, synth, "cosmo", "CosmoFlow (async I/O paper §IV): 128^3 x 12 uint16, 4 targets"
    )
    facts["layout"] = "DHWC"
    return facts


def write_neuron(job: Job) -> dict[str, Any]:
    """Neuron-Inverter-like HDF5 files: (n, length, channels) float32 + (n, targets)."""
    o = job.opts
    if min(int(o["length"]), int(o["channels"]), int(o["targets"])) < 1:
        raise ConfigError("length, channels and targets must be >= 1")
    synth = _Neuron(int(o["length"]), int(o["channels"]), int(o["targets"]), job.seed, job.n)
    facts = _write_hdf5(
        job, synth, "cell", "Neuron-Inverter (async I/O paper §IV): 1600 x 3 float32, 19 targets"
    )
    facts["layout"] = "TC"
    return facts


# ------------------------------------------------------------------ binary records


def write_cifar_bin(job: Job) -> dict[str, Any]:
    """CIFAR-10 binary: records of 1 label byte + C*H*W pixel bytes, a few files."""
    synth = _image_synth(job)
    if synth.classes > 256:
        raise ConfigError(
            f"CIFAR binary labels are one byte: classes must be <= 256, not {synth.classes}"
        )
    files = []
    rec = 1 + synth.nbytes
    for f_i, (lo, hi) in enumerate(_split(job.n, int(job.opts["files"]))):
        name = f"data_batch_{f_i + 1}.bin"
        with open(os.path.join(job.out, name), "wb") as f:
            for a, b in job.batches(rec, lo, hi):
                imgs, labels = job.images(synth, a, b)
                out = np.empty((b - a, rec), dtype=np.uint8)
                out[:, 0] = labels
                out[:, 1:] = imgs.reshape(b - a, -1)
                f.write(out.tobytes())
                job.bar.update(b - a)
        files.append(name)
    facts = _image_facts(job, synth)
    facts.update(
        format="records",
        files=files,
        open_options={"record_bytes": rec, "label_bytes": 1, "header_bytes": 0},
        record="label byte + pixels (C, H, W)",
        record_bytes_min=rec,
        record_bytes_max=rec,
    )
    return facts


# ------------------------------------------------------------------------ TFRecord


def _example(image: bytes, label: int, shape: tuple[int, ...]) -> bytes:
    """A ``tf.train.Example`` with features image (bytes), label (int64), shape (int64s).

    Features are written in key order, as TensorFlow's deterministic serialisation does.
    """

    def ld(field_no: int, payload: bytes) -> bytes:  # length-delimited field
        return varint(field_no << 3 | 2) + varint(len(payload)) + payload

    def int64s(values: list[int]) -> bytes:  # Int64List, packed
        return ld(1, b"".join(varint(v & 0xFFFFFFFFFFFFFFFF) for v in values))

    feats = {
        b"image": ld(1, ld(1, image)),  # Feature.bytes_list = 1 -> BytesList.value = 1
        b"label": ld(3, int64s([label])),  # Feature.int64_list = 3
        b"shape": ld(3, int64s(list(shape))),
    }
    entries = b"".join(ld(1, ld(1, k) + ld(2, v)) for k, v in sorted(feats.items()))
    return ld(1, entries)  # Example.features = 1


def write_tfrecord(job: Job) -> dict[str, Any]:
    """TFRecord files of raw (label + pixels) or ``tf.train.Example`` payloads, optionally
    gzip-compressed (one gzip member per ``records_per_member`` records, or one member)."""
    from feedline.formats.tfrecord import TFRecordWriter, frames

    synth = _image_synth(job)
    payload = job.opts["payload"]
    if payload not in ("raw", "example"):
        raise ConfigError(f"payload must be 'raw' or 'example', not {payload!r}")
    comp = job.opts.get("compression", "none")
    per_member = int(job.opts.get("records_per_member", 64))
    if comp not in ("none", "gzip"):
        raise ConfigError(f"compression must be 'none' or 'gzip', not {comp!r}")
    parts = _split(job.n, int(job.opts["files"]))
    files = []
    lo_size, hi_size = 1 << 62, 0
    for f_i, (lo, hi) in enumerate(parts):
        name = f"train-{f_i:05d}-of-{len(parts):05d}.tfrecord" + (".gz" if comp == "gzip" else "")
        with TFRecordWriter(os.path.join(job.out, name), comp, per_member) as f:
            for a, b in job.batches(synth.nbytes + 16, lo, hi):
                imgs, labels = job.images(synth, a, b)
                if payload == "raw":
                    lab = labels.astype("<i4").view(np.uint8).reshape(-1, 4)
                    recs = np.concatenate([lab, imgs.reshape(b - a, -1)], axis=1)
                    pays = [r.tobytes() for r in recs]
                else:
                    pays = [
                        _example(imgs[k].tobytes(), int(labels[k]), synth.shape)
                        for k in range(b - a)
                    ]
                lens = [len(p) for p in pays]
                lo_size, hi_size = min(lo_size, *lens), max(hi_size, *lens)
                if f.gzip and f.per_member:
                    for p in pays:
                        f.write(p)
                else:
                    f.write_frames(frames(pays), len(pays))
                job.bar.update(b - a)
        files.append(name)
    facts = _image_facts(job, synth)
    facts.update(
        format="tfrecord",
        files=files,
        open_options={},
        compression=comp,
        records_per_member=per_member if comp == "gzip" else None,
        payload=payload,
        record=(
            "int32 LE label + pixels (C, H, W)"
            if payload == "raw"
            else "tf.train.Example {image: bytes (C, H, W), label: int64, shape: int64[3]}"
        ),
        record_bytes_min=lo_size,
        record_bytes_max=hi_size,
    )
    return facts


# ----------------------------------------------------------------------------- npy


def _npy_open(path: str, shape: tuple[int, ...], dtype: np.dtype) -> io.BufferedWriter:
    f = open(path, "wb")  # noqa: SIM115 - returned to the caller, closed there
    np.lib.format.write_array_header_1_0(
        f, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    )
    return f


def write_npy(job: Job) -> dict[str, Any]:
    """``data.npy`` (N, C, H, W) uint8 and ``labels.npy`` (N,) int64, written in batches."""
    synth = _image_synth(job)
    data_f = _npy_open(os.path.join(job.out, "data.npy"), (job.n, *synth.shape), np.dtype(np.uint8))
    labels = np.empty(job.n, dtype="<i8")
    with data_f:
        for a, b in job.batches(synth.nbytes):
            imgs, labels[a:b] = job.images(synth, a, b)
            data_f.write(imgs.tobytes())
            job.bar.update(b - a)
    np.save(os.path.join(job.out, "labels.npy"), labels)
    facts = _image_facts(job, synth)
    facts.update(
        format="npy",
        files=["data.npy", "labels.npy"],
        open_options={"labels": "labels.npy"},
        record_bytes_min=synth.nbytes,
        record_bytes_max=synth.nbytes,
    )
    return facts
