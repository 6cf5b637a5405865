# SPDX-License-Identifier: Apache-2.0
"""The Index: where every sample of a dataset lives, as numpy columns.

Sample *i* is ``lengths[i]`` bytes at ``offsets[i]`` of ``files[file_ids[i]]``. Indexes are
cached in a versioned *sidecar* file next to the dataset (or in the cache directory when
the dataset directory is read-only). A sidecar carries a fingerprint of every dataset
file — size, ``mtime_ns`` and a SHA-256 of its head and tail, never the inode, because node
views, bind mounts and NFS change inodes — and is rejected when stale. Sidecars are
written to a temporary name and renamed, so concurrent openers never see a torn file.

Layout of a sidecar (little endian): magic ``FEEDIDX\\0``, u32 version, u32 CRC32C of
every byte after this 24-byte head, u64 header length, UTF-8 JSON header, then each column
64-byte aligned. The header also carries the dataset fingerprint (the digest of the
per-file fingerprints). Loading checks the CRC before using any column, so a sidecar
edited in place (offsets changed, bits flipped) raises :class:`StaleIndexError` and is
rebuilt, never trusted. Columns are mapped read-only, so many ranks of a node share one
copy through the page cache; where the file system refuses ``mmap`` (``ENODEV`` on some
FUSE and network mounts) the sidecar is read into memory instead. Sidecars are created
with the permissions the umask allows (``0644`` under the usual ``022``), so other users
of a shared dataset can read them.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import mmap
import os
import secrets
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import CorruptDataError, StaleIndexError

SIDECAR_MAGIC = b"FEEDIDX\0"
SIDECAR_VERSION = 2
_HEAD = struct.Struct("<8sIIQ")
_ALIGN = 64
_FP_BYTES = 64 * 1024


class Keys(Sequence[bytes]):
    """Variable-length keys packed in one byte blob (cheap at 50 M records)."""

    def __init__(self, blob: np.ndarray, starts: np.ndarray) -> None:
        self.blob = np.asarray(blob, dtype=np.uint8)
        self.starts = np.asarray(starts, dtype=np.int64)
        if self.starts.ndim != 1 or len(self.starts) < 1:
            raise ValueError("Keys.starts must have N+1 entries")

    @classmethod
    def from_list(cls, keys: Sequence[bytes]) -> Keys:
        lens = np.fromiter((len(k) for k in keys), dtype=np.int64, count=len(keys))
        starts = np.zeros(len(keys) + 1, dtype=np.int64)
        np.cumsum(lens, out=starts[1:])
        blob = np.frombuffer(b"".join(keys), dtype=np.uint8)
        return cls(blob, starts)

    def __len__(self) -> int:
        return len(self.starts) - 1

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        return self.blob[self.starts[i] : self.starts[i + 1]].tobytes()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Keys):
            return np.array_equal(self.starts, other.starts) and np.array_equal(
                self.blob, other.blob
            )
        if isinstance(other, Sequence):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


@dataclass
class Packed:
    """Samples stored inside compressed *spans* (HDF5 filtered chunks, gzip segments).

    The Index's extent of sample *i* is then its span's stored bytes (shared by every
    sample of the span, so read plans merge them into one read); unpacking span
    ``span[i]`` gives ``span_out[span[i]]`` bytes, of which the record is ``size[i]``
    bytes at ``at[i]``. ``codec`` is ``"hdf5"`` (``params``: HDF5 filter ids in pipeline
    order and the element size; ``span_arg`` is each chunk's filter mask) or ``"gzip"``
    (``span_arg`` is -1 where a gzip member starts, else the pending bits of the restart
    point's first byte, and ``span_window`` the row of ``windows`` holding its 32 KiB of
    history, -1 for none).
    """

    codec: str
    span: np.ndarray
    at: np.ndarray
    size: np.ndarray
    span_out: np.ndarray
    span_arg: np.ndarray
    span_window: np.ndarray
    windows: np.ndarray
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.span = np.asarray(self.span, dtype=np.int64)
        self.at = np.asarray(self.at, dtype=np.int64)
        self.size = np.asarray(self.size, dtype=np.int64)
        self.span_out = np.asarray(self.span_out, dtype=np.int64)
        self.span_arg = np.asarray(self.span_arg, dtype=np.int64)
        self.span_window = np.asarray(self.span_window, dtype=np.int64)
        self.windows = np.asarray(self.windows, dtype=np.uint8)
        if self.windows.ndim != 2:
            self.windows = self.windows.reshape(-1, 32768)
        n, k = len(self.span), len(self.span_out)
        if len(self.at) != n or len(self.size) != n:
            raise ValueError("Packed: span, at and size need one entry per sample")
        if len(self.span_arg) != k or len(self.span_window) != k:
            raise ValueError("Packed: span_out, span_arg and span_window need one entry per span")
        if n and (self.span.min() < 0 or self.span.max() >= k):
            raise ValueError("Packed: a sample names a span that does not exist")
        if (
            n
            and (
                (self.at < 0) | (self.size < 0) | (self.at + self.size > self.span_out[self.span])
            ).any()
        ):
            raise ValueError("Packed: a record lies outside its unpacked span")
        if k and self.span_window.max() >= len(self.windows):
            raise ValueError("Packed: a span names a window that does not exist")


@dataclass
class Index:
    """Columnar description of a dataset's samples.

    Attributes
    ----------
    files : list of str
        Dataset file paths; ``file_ids`` index into it.
    file_ids : numpy.ndarray of int32
    offsets : numpy.ndarray of int64
        Byte offset of each sample's record in its file.
    lengths : numpy.ndarray of int64
        Byte length of each sample's record.
    labels : numpy.ndarray or None
        Only where the format keeps labels outside the record (HDF5 label dataset,
        binary label byte). Shape ``(N,)`` or ``(N, k)``.
    keys : Keys or None
        LMDB keys, in key order.
    packed : Packed or None
        For compressed data: where each record lies in its unpacked span (the extent
        columns then describe the spans' stored bytes).
    meta : dict
        Format-specific facts (record shape and dtype, tree statistics, provenance...).
        JSON-serialisable.
    """

    files: list[str]
    file_ids: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    labels: np.ndarray | None = None
    keys: Keys | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    packed: Packed | None = None

    def __post_init__(self) -> None:
        self.file_ids = np.asarray(self.file_ids, dtype=np.int32)
        self.offsets = np.asarray(self.offsets, dtype=np.int64)
        self.lengths = np.asarray(self.lengths, dtype=np.int64)
        n = len(self.offsets)
        if len(self.file_ids) != n or len(self.lengths) != n:
            raise ValueError("Index columns must have equal lengths")
        if self.labels is not None and len(self.labels) != n:
            raise ValueError("Index.labels must have one row per sample")
        if self.keys is not None and len(self.keys) != n:
            raise ValueError("Index.keys must have one key per sample")
        if self.packed is not None and len(self.packed.span) != n:
            raise ValueError("Index.packed must describe every sample")

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def nbytes_payload(self) -> int:
        """Total bytes of all records (as stored: compressed spans count once per sample)."""
        return int(self.lengths.sum())

    @property
    def record_lengths(self) -> np.ndarray:
        """Length of each record as delivered (unpacked when the data is compressed)."""
        return self.lengths if self.packed is None else self.packed.size

    @functools.cached_property
    def fixed_length(self) -> int | None:
        """The common (delivered) record length, or None when lengths vary (computed once:
        the Loader asks at every step, and a scan of 200,000 lengths costs 0.08 ms)."""
        if len(self) == 0:
            return None
        lengths = self.record_lengths
        first = int(lengths[0])
        return first if bool((lengths == first).all()) else None

    def extent(self, i: int) -> tuple[int, int, int]:
        """``(file_id, offset, length)`` of sample *i*."""
        return int(self.file_ids[i]), int(self.offsets[i]), int(self.lengths[i])

    def validate_against_sizes(self, sizes: Sequence[int]) -> None:
        """Raise CorruptDataError when a record lies beyond the end of its file."""
        if len(self) == 0:
            return
        if self.file_ids.min() < 0 or self.file_ids.max() >= len(self.files):
            bad = int(np.flatnonzero((self.file_ids < 0) | (self.file_ids >= len(self.files)))[0])
            raise CorruptDataError(
                self.files[0], 0, f"sample {bad} names file id {self.file_ids[bad]}"
            )
        ends = self.offsets + self.lengths
        limit = np.asarray(sizes, dtype=np.int64)[self.file_ids]
        bad_mask = (self.offsets < 0) | (self.lengths < 0) | (ends > limit)
        if bad_mask.any():
            bad = int(np.flatnonzero(bad_mask)[0])
            raise CorruptDataError(
                self.files[self.file_ids[bad]],
                int(self.offsets[bad]),
                f"sample {bad}: record of {int(self.lengths[bad])} bytes ends beyond the file "
                f"({int(limit[bad])} bytes)",
            )


# --------------------------------------------------------------------------- fingerprint


def fingerprint(path: str) -> dict[str, Any]:
    """Size, mtime_ns and SHA-256 of the first and last 64 KiB of *path* (read with pread)."""
    st = os.stat(path)
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        h.update(os.pread(fd, _FP_BYTES, 0))
        if st.st_size > _FP_BYTES:
            tail = max(_FP_BYTES, st.st_size - _FP_BYTES)
            h.update(os.pread(fd, _FP_BYTES, tail))
    return {"size": int(st.st_size), "mtime_ns": int(st.st_mtime_ns), "sha256": h.hexdigest()}


def dataset_fingerprint(
    files: Sequence[str], fingerprints: Sequence[dict[str, Any]] | None = None
) -> str:
    """One hex digest for a whole dataset (used in loader state and sidecar headers).

    *fingerprints* (from :func:`fingerprint`, one per file) saves reading the files again.
    """
    h = hashlib.sha256()
    for i, p in enumerate(files):
        fp = fingerprint(p) if fingerprints is None else fingerprints[i]
        h.update(f"{os.path.basename(p)}:{fp['size']}:{fp['sha256']}".encode())
    return h.hexdigest()[:32]


# ------------------------------------------------------------------------------ sidecar

_COLUMNS = ("file_ids", "offsets", "lengths", "labels", "key_blob", "key_starts")
#: Packed's arrays, stored as sidecar columns ``packed_<name>``
_PACKED = ("span", "at", "size", "span_out", "span_arg", "span_window", "windows")


def _columns_of(index: Index) -> dict[str, np.ndarray]:
    cols: dict[str, np.ndarray] = {
        "file_ids": index.file_ids,
        "offsets": index.offsets,
        "lengths": index.lengths,
    }
    if index.labels is not None:
        cols["labels"] = np.ascontiguousarray(index.labels)
    if index.keys is not None:
        cols["key_blob"] = index.keys.blob
        cols["key_starts"] = index.keys.starts
    if index.packed is not None:
        for name in _PACKED:
            cols[f"packed_{name}"] = np.ascontiguousarray(getattr(index.packed, name))
    return cols


def write_sidecar(
    path: str, index: Index, *, root: str, fingerprints: list[dict[str, Any]], key: str
) -> None:
    """Write *index* atomically to *path* (temp file in the same directory + rename).

    File names are stored relative to *root* so every view of the dataset (per-node
    mounts, bind mounts) can use the same sidecar.
    """
    cols = _columns_of(index)
    layout: dict[str, Any] = {}
    pos = 0
    for name, arr in cols.items():
        pos = (pos + _ALIGN - 1) // _ALIGN * _ALIGN
        layout[name] = {"dtype": arr.dtype.str, "shape": list(arr.shape), "offset": pos}
        pos += arr.nbytes
    header = {
        "version": SIDECAR_VERSION,
        "key": key,
        "n": len(index),
        "files": [os.path.relpath(f, root) for f in index.files],
        "fingerprints": fingerprints,
        "dataset": dataset_fingerprint(index.files, fingerprints),
        "columns": layout,
        "meta": index.meta,
    }
    if index.packed is not None:
        header["packed"] = {"codec": index.packed.codec, "params": index.packed.params}
    hbytes = json.dumps(header, sort_keys=True).encode()
    data_start = (_HEAD.size + len(hbytes) + _ALIGN - 1) // _ALIGN * _ALIGN
    directory = os.path.dirname(os.path.abspath(path))
    # Our own temporary name (not mkstemp, which forces 0600): the kernel applies the
    # umask to 0666, so the sidecar gets the permissions the user's other files get.
    tmp = os.path.join(directory, f".fidx-{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            crc = 0
            at = _HEAD.size

            def emit(buf: Any, upto: int | None = None) -> None:
                nonlocal crc, at
                if upto is not None and upto > at:  # zero padding up to an aligned start
                    emit(bytes(upto - at))
                view = memoryview(buf).cast("B")
                f.write(view)
                crc = _crc32c(view, crc)
                at += view.nbytes

            f.write(bytes(_HEAD.size))  # the head, with the CRC, is written last
            emit(hbytes)
            for name, arr in cols.items():
                raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
                emit(raw, data_start + layout[name]["offset"])
            f.seek(0)
            f.write(_HEAD.pack(SIDECAR_MAGIC, SIDECAR_VERSION, crc, len(hbytes)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _crc32c(buf: Any, crc: int = 0) -> int:
    from . import _core

    return int(_core.crc32c(np.frombuffer(buf, dtype=np.uint8), crc))


def _parse_head(path: str, buf: Any) -> tuple[int, int]:
    """Check the fixed head of a sidecar image; return (stored CRC, header length)."""
    if len(buf) < _HEAD.size:
        raise CorruptDataError(path, 0, "sidecar shorter than its header")
    magic, version, crc, hlen = _HEAD.unpack_from(buf, 0)
    if magic != SIDECAR_MAGIC:
        raise CorruptDataError(path, 0, "not a feedline index sidecar (bad magic)")
    if version != SIDECAR_VERSION:
        raise StaleIndexError(path, f"sidecar version {version}, expected {SIDECAR_VERSION}")
    if hlen > 1 << 30:
        raise CorruptDataError(path, 16, f"header length {hlen} is implausible")
    return crc, hlen


def _parse_header(path: str, hbytes: bytes, hlen: int) -> tuple[dict[str, Any], int]:
    if len(hbytes) != hlen:
        raise CorruptDataError(path, _HEAD.size, "sidecar header truncated")
    try:
        header = json.loads(hbytes)
    except ValueError as e:
        raise CorruptDataError(path, _HEAD.size, f"sidecar header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise CorruptDataError(path, _HEAD.size, "sidecar header is not a JSON object")
    data_start = (_HEAD.size + hlen + _ALIGN - 1) // _ALIGN * _ALIGN
    return header, data_start


def read_sidecar_header(path: str) -> tuple[dict[str, Any], int]:
    """Return the JSON header of a sidecar and the byte where its columns start.

    Reads only the header; its content checksum is checked by :func:`load_sidecar`.
    """
    with open(path, "rb") as f:
        _, hlen = _parse_head(path, f.read(_HEAD.size))
        return _parse_header(path, f.read(hlen), hlen)


def _image(path: str) -> Any:
    """The sidecar's bytes: a read-only map, or a plain read where mmap is refused."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return b""
        try:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            if e.errno not in _NO_MMAP:
                raise
        buf = bytearray(size)
        view = memoryview(buf)
        got = 0
        while got < size:
            n = f.readinto(view[got:])
            if not n:
                raise CorruptDataError(path, got, f"sidecar shrank while read ({size} bytes)")
            got += n
        return buf


#: errnos with which a file system refuses mmap (then the sidecar is read instead)
_NO_MMAP = frozenset(
    {errno.ENODEV, errno.EINVAL, errno.EACCES, errno.EPERM, errno.ENOMEM, errno.ENOTSUP}
)


def load_sidecar(
    path: str, *, root: str, files: Sequence[str], key: str, check: bool = True
) -> Index:
    """Load a sidecar, mapping its columns read-only (or reading them without mmap).

    Raises
    ------
    StaleIndexError
        When the files, their fingerprints, the format version or the options differ, or
        the sidecar's content does not match its checksum (edited after it was written).
    CorruptDataError
        When the sidecar itself is malformed.
    OSError
        When it cannot be opened (e.g. another user's unreadable sidecar).
    """
    buf = _image(path)
    stored_crc, hlen = _parse_head(path, buf)
    header, data_start = _parse_header(path, bytes(buf[_HEAD.size : _HEAD.size + hlen]), hlen)
    if header.get("key") != key:
        raise StaleIndexError(path, f"built with other options ({header.get('key')} != {key})")
    rel = [os.path.relpath(f, root) for f in files]
    if header.get("files") != rel:
        raise StaleIndexError(path, "the dataset's file list changed")
    fps = header.get("fingerprints")
    if (
        not isinstance(fps, list)
        or len(fps) != len(files)
        or not all(isinstance(fp, dict) for fp in fps)
    ):
        raise CorruptDataError(path, _HEAD.size, "sidecar header has no fingerprint per file")
    if check:
        for f, old in zip(files, fps, strict=True):
            new = fingerprint(f)
            for k in ("size", "mtime_ns", "sha256"):
                if new[k] != old.get(k):
                    raise StaleIndexError(path, f"{f}: {k} changed ({old.get(k)} -> {new[k]})")
    crc = _crc32c(memoryview(buf)[_HEAD.size :])
    if crc != stored_crc:
        raise StaleIndexError(
            path,
            f"content checksum mismatch (CRC32C {crc:#010x}, header says {stored_crc:#010x}):"
            " the sidecar was changed after it was written",
        )
    try:
        same = header.get("dataset") == dataset_fingerprint(files, fps)
    except (KeyError, TypeError):
        same = False
    if not same:
        raise StaleIndexError(path, "the dataset fingerprint does not match the file fingerprints")
    cols: dict[str, np.ndarray] = {}
    columns = header.get("columns")
    if not isinstance(columns, dict):
        raise CorruptDataError(path, _HEAD.size, "sidecar header has no column table")
    n = header.get("n")
    for name, spec in columns.items():
        if name not in _COLUMNS and name.removeprefix("packed_") not in _PACKED:
            raise CorruptDataError(path, data_start, f"unknown column {name!r}")
        try:
            dt = np.dtype(spec["dtype"])
            shape = tuple(int(s) for s in spec["shape"])
            start = data_start + int(spec["offset"])
        except Exception as e:  # numpy parses dtype strings (even with literal_eval)
            raise CorruptDataError(path, _HEAD.size, f"column {name}: bad spec ({e})") from None
        if (
            dt.kind not in "biufc"  # numbers only: no objects, strings, void or records
            or dt.shape != ()  # a sub-array dtype ("4u1") would change the shape
            or dt.fields is not None
            or any(s < 0 for s in shape)
            or start < data_start
        ):
            raise CorruptDataError(path, _HEAD.size, f"column {name}: bad dtype or shape")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if start + nbytes > len(buf):
            raise CorruptDataError(path, start, f"column {name} extends beyond the sidecar")
        count = nbytes // dt.itemsize if dt.itemsize else 0
        col = np.frombuffer(buf, dtype=dt, count=count, offset=start).reshape(shape)
        col.flags.writeable = False
        cols[name] = col
    for name in ("file_ids", "offsets", "lengths"):
        if name not in cols or cols[name].ndim != 1 or len(cols[name]) != n:
            raise CorruptDataError(path, data_start, f"column {name} missing or not {n} long")
    keys = None
    packed = None
    try:
        if "key_starts" in cols:
            keys = Keys(cols["key_blob"], cols["key_starts"])
        if "packed" in header:
            spec = header["packed"]
            try:
                packed = Packed(
                    codec=str(spec["codec"]),
                    params=dict(spec.get("params", {})),
                    **{name: cols[f"packed_{name}"] for name in _PACKED},
                )
            except (KeyError, TypeError, ValueError) as e:
                raise CorruptDataError(path, data_start, f"packed columns unusable: {e}") from None
        return Index(
            files=list(files),
            file_ids=cols["file_ids"],
            offsets=cols["offsets"],
            lengths=cols["lengths"],
            labels=cols.get("labels"),
            keys=keys,
            meta=header.get("meta", {}),
            packed=packed,
        )
    except (KeyError, ValueError) as e:
        raise CorruptDataError(path, data_start, f"inconsistent columns: {e}") from None
