"""HDF5 files: samples are rows (first axis) of one dataset, read as raw byte ranges.

h5py is used only for metadata: the dataset's layout, its file address
(``get_offset`` for contiguous storage, ``chunk_iter``/``get_chunk_info`` for chunked
storage whose chunks hold whole rows) and a small labels dataset. The rows are then
read by feedline's own engine with plain preads, which is what lets many ranks read an
HDF5 file at the storage's speed — at the price of refusing filtered (compressed)
datasets and chunks that split samples, since those have no byte range per sample.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError, CorruptDataError, FeedlineError, UnsupportedFormatError
from ..index import Index
from .base import Decoder, Format, register
from .npy import ArrayDecoder

#: dataset names taken as labels when the ``labels`` option is not given
LABEL_NAMES = ("label", "labels", "y")
#: dtype kinds whose bytes numpy can view directly
_RAW_KINDS = "biufcS"

_REPACK = "rewrite it contiguous and unfiltered, e.g. `h5repack -l {name}:CONTI in.h5 out.h5`"


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


def row_offsets(
    path: str, name: str, dset, file_size: int
) -> tuple[np.ndarray, int, dict[str, Any]]:
    """Byte offset of every row of *dset*, the row size, and layout facts.

    Raises UnsupportedFormatError for layouts without a byte range per row, and
    CorruptDataError when a row lies beyond the end of the file.
    """
    h5d = _h5py().h5d
    where = f"{path}: dataset {name!r}"
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
                f"dataset {name!r} is filtered ({', '.join(filters)}): compressed rows have no "
                "byte range feedline can read; " + _REPACK.format(name=name),
            )
        chunks = tuple(dset.chunks)
        if chunks[1:] != tuple(dset.shape[1:]):
            raise UnsupportedFormatError(
                path,
                f"dataset {name!r} has chunks {chunks} that split samples of shape "
                f"{tuple(dset.shape[1:])}; chunks must be (k, *row_shape); "
                + _REPACK.format(name=name),
            )
        c = chunks[0]
        offsets = np.full(n, -1, dtype=np.int64)
        stored = []

        def take(info) -> None:
            stored.append((info.chunk_offset[0], info.byte_offset, info.size))

        if hasattr(dset.id, "chunk_iter"):
            dset.id.chunk_iter(take)
        else:  # pragma: no cover - older HDF5: O(chunks^2) but correct
            for i in range(dset.id.get_num_chunks()):
                take(dset.id.get_chunk_info(i))
        for first, byte_offset, size in stored:
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
        data_opt = self.options.get("dataset")
        label_opt = self.options.get("labels")
        file_ids, offsets, labels = [], [], []
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
                offs, row, facts = row_offsets(path, data_name, dset, size)
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
        return Index(
            files=list(self.files),
            file_ids=np.concatenate(file_ids),
            offsets=np.concatenate(offsets),
            lengths=np.full(n_total, row, dtype=np.int64),
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
