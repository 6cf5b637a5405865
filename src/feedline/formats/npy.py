# SPDX-License-Identifier: Apache-2.0
"""NumPy ``.npy`` files: one sample per row along the first axis.

The header (magic, version 1/2/3, a Python-literal dict with ``descr``,
``fortran_order`` and ``shape``) is parsed here with explicit reads and
``ast.literal_eval``; no pickle, no mmap. Rows of a C-order array are contiguous, so
offsets are computed: indexing costs one small read per file. Fortran-order and object
arrays have no contiguous rows (or no bytes at all) and are refused.
"""

from __future__ import annotations

import ast
import math
import os
import struct
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..errors import (
    ConfigError,
    CorruptDataError,
    DatasetNotFoundError,
    UnsupportedFormatError,
)
from ..index import Index, fingerprint
from .base import Decoder, Format, register
from .records import pread_exact

MAGIC = b"\x93NUMPY"
#: largest header accepted (numpy's own reader refuses more than 10,000 bytes by default)
MAX_HEADER = 1 << 20


@dataclass(frozen=True, slots=True)
class NpyHeader:
    """What a ``.npy`` header says: dtype, shape and where the data starts."""

    dtype: np.dtype
    shape: tuple[int, ...]
    fortran_order: bool
    data_offset: int
    version: tuple[int, int]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def read_npy_header(path: str, fd: int | None = None) -> NpyHeader:
    """Parse the header of the ``.npy`` file *path* (reads only the header).

    Raises
    ------
    CorruptDataError
        Bad magic, truncated or unparseable header, inconsistent fields.
    UnsupportedFormatError
        Unknown format version.
    """
    own = fd is None
    if own:
        fd = os.open(path, os.O_RDONLY)
    assert fd is not None
    try:
        size = os.fstat(fd).st_size
        if size < 10:
            raise CorruptDataError(
                path, size, f"file of {size} bytes is too short for a .npy header"
            )
        head = pread_exact(fd, 12 if size >= 12 else 10, 0, path)
        if head[:6] != MAGIC:
            raise CorruptDataError(path, 0, "not a .npy file (bad magic)")
        version = (head[6], head[7])
        if version[0] == 1:
            (hlen,) = struct.unpack_from("<H", head, 8)
            start = 10
        elif version[0] in (2, 3):
            if len(head) < 12:
                raise CorruptDataError(path, size, "truncated .npy header")
            (hlen,) = struct.unpack_from("<I", head, 8)
            start = 12
        else:
            raise UnsupportedFormatError(
                path, f".npy format version {version[0]}.{version[1]} (feedline reads 1, 2, 3)"
            )
        if hlen > MAX_HEADER:
            raise CorruptDataError(path, 8, f"header length {hlen} is implausible")
        if start + hlen > size:
            raise CorruptDataError(path, size, f"header of {hlen} bytes is truncated")
        raw = pread_exact(fd, hlen, start, path)
    finally:
        if own:
            os.close(fd)
    try:
        text = raw.decode("utf-8" if version[0] == 3 else "latin1")
        d = ast.literal_eval(text)
    except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError) as e:
        raise CorruptDataError(path, start, f"header is not a Python literal: {e}") from None
    if not isinstance(d, dict) or set(d) != {"descr", "fortran_order", "shape"}:
        raise CorruptDataError(
            path, start, f"header must hold descr, fortran_order and shape, not {d!r:.200}"
        )
    shape, fortran = d["shape"], d["fortran_order"]
    if not isinstance(shape, tuple) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise CorruptDataError(path, start, f"bad shape {shape!r:.100}")
    if not isinstance(fortran, bool):
        raise CorruptDataError(path, start, f"bad fortran_order {fortran!r:.100}")
    try:
        dtype = np.lib.format.descr_to_dtype(d["descr"])
    except Exception as e:  # numpy raises TypeError/ValueError/KeyError for bad descrs
        raise CorruptDataError(path, start, f"bad descr {d['descr']!r:.100}: {e}") from None
    return NpyHeader(dtype, shape, fortran, start + hlen, version)


def _check_rows(path: str, h: NpyHeader, size: int) -> int:
    """Refuse what has no contiguous fixed-size rows; return the row size in bytes."""
    if h.dtype.hasobject:
        raise UnsupportedFormatError(
            path,
            f"object dtype {h.dtype} (pickled Python objects) has no raw bytes to read; "
            "save a numeric array",
        )
    if h.fortran_order and len(h.shape) > 1:
        raise UnsupportedFormatError(
            path,
            f"Fortran-order array of shape {h.shape}: rows are not contiguous; "
            "re-save with np.save(path, np.ascontiguousarray(a))",
        )
    if len(h.shape) == 0:
        raise UnsupportedFormatError(path, "0-d array: no rows to use as samples")
    row = math.prod(h.shape[1:]) * h.dtype.itemsize
    if row == 0 and h.shape[0] > 0:
        raise UnsupportedFormatError(path, f"rows of shape {h.shape[1:]} hold zero bytes")
    if h.data_offset + h.nbytes > size:
        raise CorruptDataError(
            path,
            size,
            f"data truncated: the header promises {h.shape} {h.dtype} = {h.nbytes} bytes "
            f"from byte {h.data_offset}, the file has {size - h.data_offset}",
        )
    return row


class ArrayDecoder(Decoder):
    """Rows of one dtype and shape: ``(b, *sample_shape)``; labels from the index.

    Shared by the npy and HDF5 formats. Without *out* the result is a view of *raw*.
    """

    def __init__(
        self, sample_shape: tuple[int, ...], dtype: np.dtype, labels: np.ndarray | None
    ) -> None:
        self.sample_shape = tuple(int(s) for s in sample_shape)
        self.dtype = np.dtype(dtype)
        self._row = math.prod(self.sample_shape) * self.dtype.itemsize
        self._labels = labels

    def decode(self, raw, lengths, ids, out=None):
        b = len(lengths)
        raw = np.asarray(raw, dtype=np.uint8)
        if raw.size != b * self._row:
            raise ValueError(f"a batch of {b} rows of {self._row} bytes has {raw.size} bytes")
        data = raw.view(self.dtype).reshape(b, *self.sample_shape)
        if out is not None:
            out[...] = data
            data = out
        labels = None if self._labels is None else np.asarray(self._labels[np.asarray(ids)])
        return data, labels


def _load_labels(path: str) -> np.ndarray:
    """A small labels ``.npy`` read with explicit reads."""
    fd = os.open(path, os.O_RDONLY)
    try:
        h = read_npy_header(path, fd)
        _check_rows(path, h, os.fstat(fd).st_size)
        if h.dtype.kind not in "biuf":
            raise UnsupportedFormatError(path, f"labels of dtype {h.dtype}; expected numbers")
        raw = pread_exact(fd, h.nbytes, h.data_offset, path) if h.nbytes else b""
    finally:
        os.close(fd)
    arr = np.frombuffer(raw, dtype=h.dtype).reshape(h.shape)
    return arr.astype(arr.dtype.newbyteorder("="))


#: the labels file a dataset directory may hold
DEFAULT_LABELS = "labels.npy"


@register
class NpyFormat(Format):
    """``.npy`` files (one, a list, a directory or a glob) with equal row shape and dtype.

    Option ``labels``: a ``.npy`` of labels (or a list, one per data file), whose rows
    follow the samples in order; relative paths are looked up in the dataset directory.
    A directory holding ``labels.npy`` uses it by default (as ``feedline make npy``
    writes it); ``labels=False`` reads no labels (and ``labels.npy`` is still not data).
    """

    name: ClassVar[str] = "npy"
    extensions: ClassVar[tuple[str, ...]] = (".npy",)
    options: ClassVar[tuple[str, ...]] = ("labels",)

    def resolve(self, path):
        root, files = super().resolve(path)
        default = os.path.join(root, DEFAULT_LABELS)
        if isinstance(path, str | os.PathLike) and os.path.isdir(path) and os.path.isfile(default):
            if self.opts.get("labels") is None:
                self.opts["labels"] = DEFAULT_LABELS
            elif self.opts.get("labels") is False:
                files = [f for f in files if os.path.abspath(f) != os.path.abspath(default)]
        self.label_files = self._label_files(root)
        if self.label_files:
            files = [f for f in files if f not in self.label_files]
            if not files:
                raise ConfigError("the only .npy files given are the labels")
        return root, files

    def _label_files(self, root: str) -> list[str]:
        spec = self.opts.get("labels")
        if spec is None or spec is False:
            return []
        items = list(spec) if isinstance(spec, list | tuple) else [spec]
        out = []
        for item in items:
            p = os.fspath(item)
            if not os.path.isabs(p) and os.path.exists(os.path.join(root, p)):
                p = os.path.join(root, p)
            p = os.path.abspath(p)
            if not os.path.isfile(p):
                raise DatasetNotFoundError(p, "no such labels file")
            out.append(p)
        return out

    def sidecar_key(self) -> str:
        # The labels file is not a dataset file, so its fingerprint goes into the key:
        # replacing it makes the cached index stale.
        key = super().sidecar_key()
        if not self.label_files:
            return key
        import hashlib

        h = hashlib.sha256(key.encode())
        for f in self.label_files:
            fp = fingerprint(f)
            h.update(f"{fp['size']}:{fp['mtime_ns']}:{fp['sha256']}".encode())
        return f"{self.name}-{h.hexdigest()[:12]}"

    def build_index(self, progress: bool = False) -> Index:
        file_ids, offsets = [], []
        first: tuple[str, NpyHeader] | None = None
        row = 0
        for fid, path in enumerate(self.files):
            with open(path, "rb", buffering=0) as f:
                h = read_npy_header(path, f.fileno())
                row = _check_rows(path, h, os.fstat(f.fileno()).st_size)
            if first is None:
                first = (path, h)
            elif h.shape[1:] != first[1].shape[1:] or h.dtype != first[1].dtype:
                raise UnsupportedFormatError(
                    path,
                    f"rows of shape {h.shape[1:]} {h.dtype} differ from {first[0]}'s "
                    f"{first[1].shape[1:]} {first[1].dtype}; all files must share row shape and dtype",
                )
            n = h.shape[0]
            file_ids.append(np.full(n, fid, dtype=np.int32))
            offsets.append(h.data_offset + np.arange(n, dtype=np.int64) * row)
        assert first is not None
        h0 = first[1]
        n_total = sum(len(o) for o in offsets)
        labels = None
        if self.label_files:
            parts = [_load_labels(f) for f in self.label_files]
            labels = np.concatenate(parts) if len(parts) > 1 else parts[0]
            if len(labels) != n_total:
                raise ConfigError(
                    f"labels {self.label_files} hold {len(labels)} rows for {n_total} samples"
                )
        return Index(
            files=list(self.files),
            file_ids=np.concatenate(file_ids),
            offsets=np.concatenate(offsets),
            lengths=np.full(n_total, row, dtype=np.int64),
            labels=labels,
            meta={
                "sample_shape": list(h0.shape[1:]),
                "dtype": h0.dtype.str,
                "dtype_descr": np.lib.format.dtype_to_descr(h0.dtype),
                "npy_version": list(h0.version),
            },
        )

    def make_decoder(self, index: Index) -> Decoder:
        meta: dict[str, Any] = index.meta
        descr = meta.get("dtype_descr", meta["dtype"])
        if isinstance(descr, list):  # structured dtypes come back from JSON as lists
            descr = [tuple(x) if isinstance(x, list) else x for x in descr]
        dtype = np.lib.format.descr_to_dtype(descr)
        return ArrayDecoder(tuple(meta["sample_shape"]), dtype, index.labels)
