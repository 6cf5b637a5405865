# SPDX-License-Identifier: Apache-2.0
"""Fixed-length binary records (CIFAR-10 binary and the like).

Every file is ``header_bytes`` of header followed by records of exactly ``record_bytes``
bytes, of which the first ``label_bytes`` are the label (a little-endian unsigned
integer; or, with ``label_byte=k``, only byte k of them, for layouts that store several
one-byte labels, like CIFAR-100's coarse and fine label). Offsets are computed, so
indexing is free — except that labels are interleaved with the data: when
``label_bytes > 0`` the indexer reads each file once, sequentially in large preads, to
collect them (the sidecar caches the result, so this happens once per dataset).
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError, CorruptDataError, StorageError, UnsupportedFormatError
from ..index import Index
from .base import Decoder, Format, register, resolve_files

#: label width in bytes -> dtype of the decoded label (little endian, unsigned)
LABEL_DTYPES: dict[int, np.dtype] = {1: np.dtype("u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4")}

#: bytes per pread while collecting labels
SCAN_BYTES = 8 << 20


def pread_exact(fd: int, n: int, offset: int, path: str) -> bytes:
    """Read exactly *n* bytes at *offset*; a short read is CorruptDataError."""
    chunks = []
    got = 0
    while got < n:
        try:
            b = os.pread(fd, n - got, offset + got)
        except InterruptedError:
            continue
        except OSError as e:
            raise StorageError(path, offset + got, e.errno or 0) from e
        if not b:
            raise CorruptDataError(path, offset + got, f"file ends {n - got} bytes early")
        chunks.append(b)
        got += len(b)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _int_option(options: dict[str, Any], name: str, default: int | None, minimum: int) -> int:
    value = options.get(name, default)
    if value is None:
        raise ConfigError(
            f"format 'records' needs {name}= (bytes per record, e.g. 3073 for CIFAR-10)"
        )
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ConfigError(f"{name} must be an integer, not {value!r}")
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, not {value}")
    return int(value)


@register
class RecordsFormat(Format):
    """Fixed-length records; options ``record_bytes`` (required), ``label_bytes``,
    ``label_byte``, ``header_bytes``.

    A directory means its ``*.bin`` files (or all its files when it has none).
    """

    name: ClassVar[str] = "records"
    extensions: ClassVar[tuple[str, ...]] = (".bin",)
    options: ClassVar[tuple[str, ...]] = (
        "record_bytes",
        "label_bytes",
        "label_byte",
        "header_bytes",
    )

    def __init__(self, path, **options: Any) -> None:
        super().__init__(path, **options)
        record = _int_option(self.opts, "record_bytes", None, 1)
        label = _int_option(self.opts, "label_bytes", 0, 0)
        header = _int_option(self.opts, "header_bytes", 0, 0)
        if label and label not in LABEL_DTYPES:
            raise ConfigError(f"label_bytes must be 0, 1, 2 or 4, not {label}")
        if label >= record:
            raise ConfigError(f"label_bytes ({label}) must be smaller than record_bytes ({record})")
        pick = self.opts.get("label_byte")
        if pick is not None:
            pick = _int_option(self.opts, "label_byte", None, 0)
            if pick >= label:
                raise ConfigError(
                    f"label_byte={pick} must name one of the {label} label bytes "
                    "(e.g. label_bytes=2, label_byte=1 for CIFAR-100's fine label)"
                )
        # normalised, so equal configurations share one sidecar
        self.opts.clear()  # in place: self.options is the same dict
        self.opts.update(record_bytes=record, label_bytes=label, header_bytes=header)
        if pick is not None:
            self.opts["label_byte"] = pick
        self.record_bytes, self.label_bytes, self.header_bytes = record, label, header
        self.label_byte: int | None = pick

    @classmethod
    def sniff(cls, path: str) -> bool:
        return False  # raw records carry no signature: the user must name the format

    def resolve(self, path):
        try:
            return resolve_files(path, self.extensions, self.name)
        except UnsupportedFormatError:
            return resolve_files(path, (), self.name)

    def build_index(self, progress: bool = False) -> Index:
        rb, lb, hb = self.record_bytes, self.label_bytes, self.header_bytes
        file_ids, offsets, labels = [], [], []
        for fid, path in enumerate(self.files):
            size = os.path.getsize(path)
            if size < hb:
                raise CorruptDataError(
                    path, size, f"file of {size} bytes is shorter than header_bytes={hb}"
                )
            n, rest = divmod(size - hb, rb)
            if rest:
                raise CorruptDataError(
                    path,
                    hb + n * rb,
                    f"trailing partial record: {rest} bytes after {n} records of {rb} bytes "
                    "(truncated file, or wrong record_bytes/header_bytes)",
                )
            file_ids.append(np.full(n, fid, dtype=np.int32))
            offsets.append(hb + np.arange(n, dtype=np.int64) * rb)
            if lb:
                labels.append(self._read_labels(path, n))
        n_total = sum(len(o) for o in offsets)
        return Index(
            files=list(self.files),
            file_ids=np.concatenate(file_ids) if file_ids else np.zeros(0, np.int32),
            offsets=np.concatenate(offsets) if offsets else np.zeros(0, np.int64),
            lengths=np.full(n_total, rb, dtype=np.int64),
            labels=np.concatenate(labels) if lb else None,
            meta={
                "record_bytes": rb,
                "label_bytes": lb,
                "label_byte": self.label_byte,
                "header_bytes": hb,
                "sample_shape": [rb - lb],
                "dtype": "uint8",
            },
        )

    def _read_labels(self, path: str, n: int) -> np.ndarray:
        rb, lb, hb = self.record_bytes, self.label_bytes, self.header_bytes
        pick = self.label_byte
        dt = LABEL_DTYPES[lb] if pick is None else np.dtype("u1")
        out = np.empty(n, dtype=dt.newbyteorder("="))
        per_read = max(1, SCAN_BYTES // rb)
        fd = os.open(path, os.O_RDONLY)
        try:
            for start in range(0, n, per_read):
                k = min(per_read, n - start)
                buf = pread_exact(fd, k * rb, hb + start * rb, path)
                rows = np.frombuffer(buf, dtype=np.uint8).reshape(k, rb)
                if pick is None:
                    out[start : start + k] = np.ascontiguousarray(rows[:, :lb]).view(dt).ravel()
                else:
                    out[start : start + k] = rows[:, pick]
        finally:
            os.close(fd)
        return out

    def make_decoder(self, index: Index) -> Decoder:
        return RecordsDecoder(index, self.label_bytes)

    def describe(self, index: Index) -> dict[str, Any]:
        info = dict(index.meta)
        if index.labels is not None and len(index.labels):
            info["label_classes"] = len(np.unique(index.labels))
        return info


class RecordsDecoder(Decoder):
    """Records without their label bytes: ``(b, record_bytes - label_bytes)`` uint8.

    Labels come from the index. Without *out*, the result is a view of *raw*.
    """

    def __init__(self, index: Index, label_bytes: int) -> None:
        meta = index.meta
        self.record_bytes = int(meta.get("record_bytes", index.fixed_length or 0))
        self.label_bytes = int(label_bytes)
        self.sample_shape = (self.record_bytes - self.label_bytes,)
        self.dtype = np.dtype(np.uint8)
        self._labels = index.labels

    def decode(self, raw, lengths, ids, out=None):
        b = len(lengths)
        raw = np.asarray(raw, dtype=np.uint8)
        if raw.size != b * self.record_bytes:
            raise ValueError(
                f"a batch of {b} records of {self.record_bytes} bytes has {raw.size} bytes"
            )
        data = raw.reshape(b, self.record_bytes)[:, self.label_bytes :]
        if out is not None:
            out[...] = data.reshape(out.shape)
            data = out
        labels = None if self._labels is None else np.asarray(self._labels[np.asarray(ids)])
        return data, labels
