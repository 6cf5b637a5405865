"""TFRecord files: length-prefixed, CRC-checked frames of opaque payloads.

A frame is ``u64 length | u32 masked CRC32C(length) | payload | u32 masked
CRC32C(payload)``. There is no index inside the file, so the indexer scans every frame
natively (large sequential preads, both CRCs verified) and records each payload's
offset and length; the scan reads the whole dataset once, and the sidecar makes it a
one-time cost. Payloads (usually ``tf.train.Example`` protos) are delivered raw.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np

from .. import _core
from ..errors import ConfigError, UnsupportedFormatError
from ..index import Index
from .base import Format, register

#: default bytes per pread while scanning
SCAN_BYTES = 8 << 20


def _bytes(data) -> np.ndarray:
    return np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)


def crc32c(data, crc: int = 0) -> int:
    """CRC32C (Castagnoli) of a bytes-like object, extending *crc*."""
    return int(_core.crc32c(_bytes(data), crc))


def masked_crc32c(data) -> int:
    """The masked CRC32C a TFRecord frame stores for *data*."""
    return int(_core.masked_crc32c(_bytes(data)))


def frame(payload) -> bytes:
    """One TFRecord frame holding *payload*."""
    payload = bytes(payload)
    head = len(payload).to_bytes(8, "little")
    return b"".join(
        (
            head,
            masked_crc32c(head).to_bytes(4, "little"),
            payload,
            masked_crc32c(payload).to_bytes(4, "little"),
        )
    )


def write_tfrecord(path: str | os.PathLike[str], payloads: Iterable[bytes]) -> int:
    """Write *payloads* as a TFRecord file; return the number of records."""
    n = 0
    with open(path, "wb") as f:
        for p in payloads:
            f.write(frame(p))
            n += 1
    return n


@register
class TFRecordFormat(Format):
    """TFRecord files (one, a list, a directory or a glob); payloads are raw records.

    Options: ``verify`` (default True: check every payload CRC while indexing; False
    checks only the length CRCs) and ``buffer_bytes`` (pread size of the scan, 8 MiB).
    """

    name: ClassVar[str] = "tfrecord"
    extensions: ClassVar[tuple[str, ...]] = (".tfrecord", ".tfrecords")
    options: ClassVar[tuple[str, ...]] = ("verify", "buffer_bytes")

    def __init__(self, path, **options: Any) -> None:
        super().__init__(path, **options)
        self.verify = bool(self.options.get("verify", True))
        self.buffer_bytes = int(self.options.get("buffer_bytes", SCAN_BYTES))
        if self.buffer_bytes < 4096:
            raise ConfigError(f"buffer_bytes must be >= 4096, not {self.buffer_bytes}")

    def sidecar_key(self) -> str:
        # How the scan reads does not change the index: one sidecar for every setting.
        return f"{self.name}-v1"

    def build_index(self, progress: bool = False) -> Index:
        file_ids, offsets, lengths = [], [], []
        reads = scanned = 0
        for fid, path in enumerate(self.files):
            with open(path, "rb") as f:
                magic = f.read(2)
            if magic == b"\x1f\x8b":
                raise UnsupportedFormatError(
                    path,
                    "GZIP-compressed TFRecord; feedline reads uncompressed TFRecords "
                    "(decompress with gunzip, or write with compression_type=None)",
                )
            offs, lens, r, b = _core.scan_tfrecord(path, self.buffer_bytes, self.verify)
            file_ids.append(np.full(len(offs), fid, dtype=np.int32))
            offsets.append(offs)
            lengths.append(lens)
            reads += int(r)
            scanned += int(b)
        return Index(
            files=list(self.files),
            file_ids=np.concatenate(file_ids),
            offsets=np.concatenate(offsets),
            lengths=np.concatenate(lengths),
            meta={"crc_verified": self.verify, "scan_preads": reads, "scan_bytes": scanned},
        )
