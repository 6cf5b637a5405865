# SPDX-License-Identifier: Apache-2.0
"""HDF5 files: samples are rows (first axis) of one dataset, read as raw byte ranges.

h5py is used only for metadata: the dataset's layout, its file address
(``get_offset`` for contiguous storage, ``chunk_iter``/``get_chunk_info`` for chunked
storage whose chunks hold whole rows) and a small labels dataset. The rows are then
read by feedline's own engine with plain preads, which is what lets many ranks read an
HDF5 file at the storage's speed. Filtered chunks (deflate/gzip, shuffle, LZF) are read
the same way, as whole stored chunks, and unpacked by the native core
(:mod:`feedline.formats.packed`); other filters and chunks that split samples are
refused, since feedline cannot get a sample's bytes from them.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError, CorruptDataError, FeedlineError, UnsupportedFormatError
from ..index import Index, Packed
from .base import Decoder, Format, register
from .npy import ArrayDecoder

#: dataset names taken as labels when the ``labels`` option is not given
LABEL_NAMES = ("label", "labels", "y")
#: dtype kinds whose bytes numpy can view directly
_RAW_KINDS = "biufcS"

_REPACK = "rewrite it contiguous and unfiltered, e.g. `h5repack -l {name}:CONTI in.h5 out.h5`"

#: HDF5 filter ids feedline unpacks natively -> their names
FILTERS = {1: "deflate", 2: "shuffle", 32000: "lzf"}


def _h5py():
    try:
        import h5py
    except ImportError as e:  # pragma: no cover - h5py is a test dependency
        raise UnsupportedFormatError("hdf5", "reading HDF5 needs h5py (pip install h5py)") from e
    return h5py


def _open(path: str):
    h5py = _h5py()
    try:
        return h5py.File(path, "r")
    except OSError as e:
        msg = str(e)
        size = os.path.getsize(path)
        if "truncated" in msg:
            raise CorruptDataError(path, size, f"truncated HDF5 file: {msg}") from None
        raise CorruptDataError(path, 0, f"not a readable HDF5 file: {msg}") from None


@contextlib.contextmanager
def _metadata_errors(path: str):
    """Turn HDF5 library errors on damaged metadata into CorruptDataError."""
    try:
        yield
    except FeedlineError:
        raise
    except (KeyError, OSError, RuntimeError, ValueError, TypeError) as e:
        raise CorruptDataError(
            path, 0, f"HDF5 metadata unreadable ({type(e).__name__}: {e})"
        ) from None


def _datasets(f) -> list[tuple[str, Any]]:
    h5py = _h5py()
    found: list[tuple[str, Any]] = []

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            found.append((name, obj))

    f.visititems(visit)
    return found


def _is_label_name(name: str) -> bool:
    return name.rsplit("/", 1)[-1].lower() in LABEL_NAMES


def choose_datasets(
    path: str, f, data: str | None, labels: str | bool | None
) -> tuple[str, str | None]:
    """Resolve the data and labels dataset names of file *f* (see the format's options)."""
    found = _datasets(f)
    names = [n for n, _ in found]
    if labels is None:
        cands = sorted(
            (n for n in names if _is_label_name(n) and n != data), key=lambda n: (n.count("/"), n)
        )
        label_name = cands[0] if cands else None
    elif labels is False or labels == "":
        label_name = None
    else:
        label_name = str(labels).strip("/")
        if label_name not in names:
            raise ConfigError(f"{path}: no labels dataset {label_name!r}; datasets: {names}")
    if data is not None:
        data_name = str(data).strip("/")
        if data_name not in names:
            raise ConfigError(f"{path}: no dataset {data_name!r}; datasets: {names}")
        return data_name, label_name
    cands2 = [(n, d) for n, d in found if n != label_name and d.ndim >= 1]
    if not cands2:
        raise UnsupportedFormatError(path, f"no dataset to read samples from (datasets: {names})")
    # the largest dataset (ties: first by name, so every file of a dataset agrees)
    best = max(
        sorted(cands2, key=lambda nd: nd[0]), key=lambda nd: nd[1].size * nd[1].dtype.itemsize
    )
    return best[0], label_name


def check_rows(path: str, name: str, dset) -> None:
    """Refuse datasets whose rows feedline cannot deliver as bytes (scalars, objects...)."""
    if dset.ndim < 1:
        raise UnsupportedFormatError(
            path, f"dataset {name!r} is a scalar; samples are rows of the first axis"
        )
    dt = dset.dtype
    if dt.kind not in _RAW_KINDS or dt.hasobject or dt.fields is not None:
        raise UnsupportedFormatError(
            path,
            f"dataset {name!r} has dtype {dt}; feedline reads numeric or fixed-length bytes datasets",
        )
    if int(dset.shape[0]) and not math.prod(dset.shape[1:]) * dt.itemsize:
        raise UnsupportedFormatError(path, f"dataset {name!r} has rows of zero bytes")


def dataset_filters(path: str, name: str, dset) -> list[tuple[int, list[int]]]:
    """The filter pipeline of a chunked dataset: ``[(filter id, cd_values)]`` in order.

    Raises UnsupportedFormatError naming the first filter feedline cannot undo.
    """
    dcpl = dset.id.get_create_plist()
    out = []
    for i in range(dcpl.get_nfilters()):
        code, _flags, values, fname = dcpl.get_filter(i)
        if int(code) not in FILTERS:
            label = fname.decode(errors="replace") if isinstance(fname, bytes) else str(fname)
            raise UnsupportedFormatError(
                path,
                f"dataset {name!r} uses HDF5 filter {int(code)} ({label or 'unnamed'}); feedline "
                f"unpacks {', '.join(FILTERS.values())} only; " + _REPACK.format(name=name),
            )
        out.append((int(code), [int(v) for v in values]))
    return out


def _chunk_rows(path: str, name: str, dset) -> int:
    """Rows per chunk of a chunked *dset*; its chunks must hold whole rows."""
    chunks = tuple(dset.chunks)
    if chunks[1:] != tuple(dset.shape[1:]):
        raise UnsupportedFormatError(
            path,
            f"dataset {name!r} has chunks {chunks} that split samples of shape "
            f"{tuple(dset.shape[1:])}; chunks must be (k, *row_shape); "
            + _REPACK.format(name=name),
        )
    return int(chunks[0])


def _stored_chunks(dset) -> list[tuple[int, int | None, int, int]]:
    """``(first row, byte offset or None, stored bytes, filter mask)`` of every chunk of
    *dset* in the file, in HDF5's order."""
    stored: list[tuple[int, int | None, int, int]] = []

    def take(info) -> None:
        stored.append((info.chunk_offset[0], info.byte_offset, info.size, info.filter_mask))

    if hasattr(dset.id, "chunk_iter"):
        dset.id.chunk_iter(take)
    else:  # pragma: no cover - older HDF5: O(chunks^2) but correct
        for i in range(dset.id.get_num_chunks()):
            take(dset.id.get_chunk_info(i))
    return stored


def filtered_chunks(
    path: str, name: str, dset, file_size: int, filters: list[tuple[int, list[int]]]
) -> dict[str, Any]:
    """Stored chunks of a filtered dataset and where each row lies in its chunk.

    Returns per row ``chunk`` (chunk number in this file), ``offset``/``stored`` (the
    chunk's file range), ``at`` (byte offset of the row in the unpacked chunk), and per
    chunk ``masks`` (HDF5's filter mask) and ``chunk_bytes`` (its unpacked size).
    """
    n = int(dset.shape[0])
    row = math.prod(dset.shape[1:]) * dset.dtype.itemsize
    c = _chunk_rows(path, name, dset)
    stored = sorted(_stored_chunks(dset), key=lambda t: t[0])
    chunk = np.full(n, -1, dtype=np.int64)
    offset = np.zeros(n, dtype=np.int64)
    size = np.zeros(n, dtype=np.int64)
    masks: list[int] = []
    for first, byte_offset, nbytes, mask in stored:
        if byte_offset is None or first >= n:
            continue
        if first % c:
            raise CorruptDataError(
                path,
                byte_offset,
                f"dataset {name!r}: chunk at row {first} is not aligned to its {c}-row chunks",
            )
        if byte_offset + nbytes > file_size:
            raise CorruptDataError(
                path,
                byte_offset,
                f"dataset {name!r}: chunk at row {first} ({nbytes} stored bytes) ends beyond "
                f"the end of the file ({file_size} bytes)",
            )
        k = min(c, n - first)
        chunk[first : first + k] = len(masks)
        offset[first : first + k] = byte_offset
        size[first : first + k] = nbytes
        masks.append(int(mask))
    if (chunk < 0).any():
        missing = int(np.flatnonzero(chunk < 0)[0])
        raise UnsupportedFormatError(
            path,
            f"dataset {name!r}: the chunk holding row {missing} was never written "
            "(unallocated chunks hold only fill values)",
        )
    rows = np.arange(n, dtype=np.int64)
    return {
        "chunk": chunk,
        "offset": offset,
        "stored": size,
        "at": (rows % c) * row,
        "masks": np.asarray(masks, dtype=np.int64),
        "chunk_bytes": c * row,
        "chunk_rows": c,
    }


def row_offsets(
    path: str, name: str, dset, file_size: int
) -> tuple[np.ndarray, int, dict[str, Any]]:
    """Byte offset of every row of *dset*, the row size, and layout facts.

    Raises UnsupportedFormatError for layouts without a byte range per row, and
    CorruptDataError when a row lies beyond the end of the file.
    """
    h5d = _h5py().h5d
    where = f"{path}: dataset {name!r}"
    check_rows(path, name, dset)
    dt = dset.dtype
    n = int(dset.shape[0])
    row = math.prod(dset.shape[1:]) * dt.itemsize
    dcpl = dset.id.get_create_plist()
    layout = dcpl.get_layout()
    if dcpl.get_external_count() > 0:
        raise UnsupportedFormatError(
            path, f"dataset {name!r} keeps its data in external files; " + _REPACK.format(name=name)
        )
    facts: dict[str, Any] = {}
    if n == 0 or row == 0:
        if n and not row:
            raise UnsupportedFormatError(path, f"dataset {name!r} has rows of zero bytes")
        return np.zeros(0, dtype=np.int64), row, {"layout": "empty"}
    if layout == h5d.CONTIGUOUS:
        base = dset.id.get_offset()
        if base is None:
            raise UnsupportedFormatError(
                path,
                f"dataset {name!r} has no storage allocated (it was never written: its "
                "values are only fill values)",
            )
        offsets = base + np.arange(n, dtype=np.int64) * row
        facts["layout"] = "contiguous"
    elif layout == h5d.CHUNKED:
        if dcpl.get_nfilters() > 0:
            filters = [
                dcpl.get_filter(i)[3].decode(errors="replace") or str(dcpl.get_filter(i)[0])
                for i in range(dcpl.get_nfilters())
            ]
            raise UnsupportedFormatError(
                path,
                f"dataset {name!r} is filtered ({', '.join(filters)}): rows have no byte range "
                "of their own (the format unpacks whole chunks: see filtered_chunks)",
            )
        c = _chunk_rows(path, name, dset)
        offsets = np.full(n, -1, dtype=np.int64)
        for first, byte_offset, size, _mask in _stored_chunks(dset):
            if byte_offset is None:
                continue
            if size != c * row:
                raise CorruptDataError(
                    path,
                    byte_offset,
                    f"dataset {name!r}: chunk at row {first} stores {size} bytes, expected {c * row}",
                )
            k = min(c, n - first)
            if k > 0:
                offsets[first : first + k] = byte_offset + np.arange(k, dtype=np.int64) * row
        if (offsets < 0).any():
            missing = int(np.flatnonzero(offsets < 0)[0])
            raise UnsupportedFormatError(
                path,
                f"dataset {name!r}: the chunk holding row {missing} was never written "
                "(unallocated chunks hold only fill values)",
            )
        facts.update(layout="chunked", chunk_rows=c)
    elif layout == h5d.COMPACT:
        raise UnsupportedFormatError(
            path,
            f"dataset {name!r} is compact (stored in its object header); "
            + _REPACK.format(name=name),
        )
    else:
        raise UnsupportedFormatError(
            path, f"dataset {name!r} has layout {layout} (virtual?); " + _REPACK.format(name=name)
        )
    ends = offsets + row
    if len(ends) and int(ends.max()) > file_size:
        bad = int(np.flatnonzero(ends > file_size)[0])
        raise CorruptDataError(
            path,
            int(offsets[bad]),
            f"{where}: row {bad} ({row} bytes at {int(offsets[bad])}) "
            f"ends beyond the end of the file ({file_size} bytes)",
        )
    return offsets, row, facts


@register
class HDF5Format(Format):
    """Rows of one HDF5 dataset per file; options ``dataset`` and ``labels``.

    ``dataset`` defaults to the only (or largest) dataset; ``labels`` defaults to a
    dataset named ``label``, ``labels`` or ``y`` when present (``labels=False``: none).
    Every file must hold the dataset with equal row shape and dtype.
    """

    name: ClassVar[str] = "hdf5"
    extensions: ClassVar[tuple[str, ...]] = (".h5", ".hdf5")
    options: ClassVar[tuple[str, ...]] = ("dataset", "labels")

    def build_index(self, progress: bool = False) -> Index:
        data_opt = self.opts.get("dataset")
        label_opt = self.opts.get("labels")
        file_ids, offsets, labels = [], [], []
        chunks: list[dict[str, Any]] = []  # filtered datasets: filtered_chunks() per file
        pipeline0: Any = ()
        shape0: tuple[int, ...] | None = None
        dtype0: np.dtype | None = None
        facts0: dict[str, Any] = {}
        data_name = label_name = None
        row = 0
        for fid, path in enumerate(self.files):
            size = os.path.getsize(path)
            with _open(path) as f, _metadata_errors(path):
                if data_name is None:
                    data_name, label_name = choose_datasets(path, f, data_opt, label_opt)
                elif data_name not in f:
                    raise ConfigError(
                        f"{path}: no dataset {data_name!r} (found in {self.files[0]})"
                    )
                dset = f[data_name]
                pipeline = None
                if dset.chunks is not None and dset.id.get_create_plist().get_nfilters() > 0:
                    pipeline = dataset_filters(path, data_name, dset)
                if fid and (pipeline is None) != (pipeline0 is None):
                    raise UnsupportedFormatError(
                        path,
                        f"dataset {data_name!r} is {'un' if pipeline is None else ''}filtered, "
                        f"unlike in {self.files[0]}; every file must be stored alike",
                    )
                if pipeline is not None:
                    check_rows(path, data_name, dset)
                    fc = filtered_chunks(path, data_name, dset, size, pipeline)
                    if fid and (
                        pipeline != pipeline0 or fc["chunk_bytes"] != chunks[0]["chunk_bytes"]
                    ):
                        raise UnsupportedFormatError(
                            path,
                            f"dataset {data_name!r} has filters {pipeline} and "
                            f"{fc['chunk_rows']}-row chunks, unlike {self.files[0]}'s",
                        )
                    chunks.append(fc)
                    offs, row = fc["offset"], math.prod(dset.shape[1:]) * dset.dtype.itemsize
                    facts = {
                        "layout": "chunked",
                        "chunk_rows": fc["chunk_rows"],
                        "filters": [FILTERS[code] for code, _ in pipeline],
                    }
                else:
                    offs, row, facts = row_offsets(path, data_name, dset, size)
                pipeline0 = pipeline if fid == 0 else pipeline0
                if shape0 is None:
                    shape0, dtype0, facts0 = tuple(dset.shape[1:]), dset.dtype, facts
                elif tuple(dset.shape[1:]) != shape0 or dset.dtype != dtype0:
                    raise UnsupportedFormatError(
                        path,
                        f"dataset {data_name!r} has rows {tuple(dset.shape[1:])} {dset.dtype}, "
                        f"unlike {self.files[0]}'s {shape0} {dtype0}",
                    )
                if label_name is not None:
                    if label_name not in f:
                        raise ConfigError(
                            f"{path}: no labels dataset {label_name!r} (found in {self.files[0]})"
                        )
                    lab = np.asarray(f[label_name][...])
                    if lab.ndim == 0 or len(lab) != len(offs):
                        raise ConfigError(
                            f"{path}: labels {label_name!r} of shape {lab.shape} do not match "
                            f"{len(offs)} samples of {data_name!r}"
                        )
                    if lab.dtype.kind not in "biuf":
                        raise UnsupportedFormatError(
                            path, f"labels {label_name!r} of dtype {lab.dtype}; expected numbers"
                        )
                    labels.append(lab.astype(lab.dtype.newbyteorder("=")))
            file_ids.append(np.full(len(offs), fid, dtype=np.int32))
            offsets.append(offs)
        assert shape0 is not None and dtype0 is not None
        n_total = sum(len(o) for o in offsets)
        packed = None
        lengths = np.full(n_total, row, dtype=np.int64)
        if chunks:
            packed, lengths = _packed(chunks, pipeline0, dtype0.itemsize, row)
        return Index(
            files=list(self.files),
            file_ids=np.concatenate(file_ids),
            offsets=np.concatenate(offsets),
            lengths=lengths,
            packed=packed,
            labels=np.concatenate(labels) if labels else None,
            meta={
                "dataset": data_name,
                "labels": label_name,
                "sample_shape": list(shape0),
                "dtype": dtype0.str,
                **facts0,
            },
        )

    def make_decoder(self, index: Index) -> Decoder:
        meta = index.meta
        return ArrayDecoder(tuple(meta["sample_shape"]), np.dtype(meta["dtype"]), index.labels)


def _packed(chunks: list[dict[str, Any]], pipeline, itemsize: int, row: int):
    """The Packed description of filtered datasets (chunk numbers global over files)."""
    base, spans, masks = 0, [], []
    for fc in chunks:
        spans.append(fc["chunk"] + base)
        masks.append(fc["masks"])
        base += len(fc["masks"])
    span_arg = np.concatenate(masks)
    # the shuffle filter's element size is its first client value (HDF5 sets the type's)
    shuffle = [vals[0] for code, vals in pipeline if code == 2 and vals]
    packed = Packed(
        codec="hdf5",
        span=np.concatenate(spans),
        at=np.concatenate([fc["at"] for fc in chunks]),
        size=np.full(sum(len(fc["at"]) for fc in chunks), row, dtype=np.int64),
        span_out=np.full(len(span_arg), chunks[0]["chunk_bytes"], dtype=np.int64),
        span_arg=span_arg,
        span_window=np.full(len(span_arg), -1, dtype=np.int64),
        windows=np.zeros((0, 32768), dtype=np.uint8),
        params={
            "filters": [code for code, _ in pipeline],
            "itemsize": int(shuffle[0] if shuffle else itemsize),
        },
    )
    return packed, np.concatenate([fc["stored"] for fc in chunks])
