# SPDX-License-Identifier: Apache-2.0
"""TFRecord files: length-prefixed, CRC-checked frames of opaque payloads.

A frame is ``u64 length | u32 masked CRC32C(length) | payload | u32 masked
CRC32C(payload)``. There is no index inside the file, so the indexer scans every frame
natively (large sequential preads, both CRCs verified) and records each payload's
offset and length; the scan reads the whole dataset once, and the sidecar makes it a
one-time cost. Payloads (usually ``tf.train.Example`` protos) are delivered raw.

GZIP-compressed files (TensorFlow's ``compression_type="GZIP"``, recognised by the gzip
magic bytes) are indexed in one native pass that inflates the file, checks the frames
and places *restart points* — every gzip member start, and inside a member the first
deflate block boundary after every ``restart_bytes`` (1 MiB) of output, keeping the
32 KiB window there — so any record costs at most about ``restart_bytes`` plus its own
size of inflate. Files written with one gzip member per few records
(:func:`write_tfrecord` with ``records_per_member``) restart at every member and need no
windows.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np

from .. import _core
from ..errors import ConfigError, UnsupportedFormatError
from ..index import Index, Packed
from .base import Format, register

#: default bytes per pread while scanning
SCAN_BYTES = 8 << 20
#: default decompressed bytes between restart points of a gzip TFRecord
RESTART_BYTES = 1 << 20
#: default records per gzip member written by write_tfrecord(compression="gzip")
RECORDS_PER_MEMBER = 64
GZIP_MAGIC = b"\x1f\x8b"


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


def frames(payloads: Iterable) -> bytes:
    """TFRecord frames holding *payloads*, back to back (see :func:`frame`)."""
    return b"".join(frame(p) for p in payloads)


def gzip_member(data: bytes, level: int = 6) -> bytes:
    """One complete gzip member holding *data* (mtime 0, so output is reproducible)."""
    z = zlib.compressobj(level, zlib.DEFLATED, 31)
    return z.compress(data) + z.flush()


class TFRecordWriter:
    """Writes TFRecord frames to *path*, uncompressed or gzip-compressed.

    With ``compression="gzip"``, every ``records_per_member`` records close a gzip member
    (a file any gzip reader, and TensorFlow's ``compression_type="GZIP"``, reads as one
    stream) so feedline can start inflating at any member; ``records_per_member=0``
    writes one member (plain ``gzip``), which feedline reads through restart points.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        compression: str | None = None,
        records_per_member: int = RECORDS_PER_MEMBER,
        level: int = 6,
    ) -> None:
        if compression not in (None, "none", "gzip", "GZIP"):
            raise ConfigError(f"compression must be None or 'gzip', not {compression!r}")
        if isinstance(records_per_member, bool) or int(records_per_member) < 0:
            raise ConfigError(f"records_per_member must be >= 0, not {records_per_member!r}")
        self.gzip = compression in ("gzip", "GZIP")
        self.per_member = int(records_per_member)
        self.level = int(level)
        self._f = open(path, "wb")  # noqa: SIM115 - closed by close()
        self._pending: list[bytes] = []
        self._stream = zlib.compressobj(self.level, zlib.DEFLATED, 31) if self.gzip else None
        self.records = 0

    def write_frames(self, frames: bytes, count: int) -> None:
        """Append *count* already framed records (see :func:`frame`)."""
        if not self.gzip:
            self._f.write(frames)
        elif self.per_member == 0:
            assert self._stream is not None
            self._f.write(self._stream.compress(frames))
        else:
            raise ConfigError("write_frames needs one record at a time with records_per_member")
        self.records += count

    def write(self, payload: bytes) -> None:
        """Append one record."""
        fr = frame(payload)
        if self.gzip and self.per_member:
            self._pending.append(fr)
            if len(self._pending) >= self.per_member:
                self._flush_member()
            self.records += 1
        else:
            self.write_frames(fr, 1)

    def _flush_member(self) -> None:
        if self._pending:
            self._f.write(gzip_member(b"".join(self._pending), self.level))
            self._pending = []

    def close(self) -> None:
        """Finish the last member and close the file."""
        if self._f.closed:
            return
        try:
            if self.gzip and self.per_member:
                self._flush_member()
            elif self._stream is not None:
                self._f.write(self._stream.flush())
        finally:
            self._f.close()

    def __enter__(self) -> TFRecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_tfrecord(
    path: str | os.PathLike[str],
    payloads: Iterable[bytes],
    compression: str | None = None,
    records_per_member: int = RECORDS_PER_MEMBER,
) -> int:
    """Write *payloads* as a TFRecord file; return the number of records.

    ``compression="gzip"`` writes a gzip-compressed file with one gzip member per
    ``records_per_member`` records (0: a single member, as ``gzip`` or TensorFlow write).
    """
    with TFRecordWriter(path, compression, records_per_member) as w:
        for p in payloads:
            w.write(p)
    return w.records


def is_gzip(path: str) -> bool:
    """True when *path* starts with the gzip magic bytes."""
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def looks_like_gzip_tfrecord(path: str) -> bool:
    """True when *path* is gzip whose stream starts with a valid TFRecord frame header."""
    try:
        with open(path, "rb") as f:
            head = f.read(64 << 10)
        if head[:2] != GZIP_MAGIC:
            return False
        data = zlib.decompressobj(31).decompress(head, 12)
    except (OSError, zlib.error):
        return False
    return len(data) == 12 and int.from_bytes(data[8:12], "little") == masked_crc32c(data[:8])


@register
class TFRecordFormat(Format):
    """TFRecord files (one, a list, a directory or a glob); payloads are raw records.

    Options: ``verify`` (default True: check every payload CRC while indexing; False
    checks only the length CRCs), ``buffer_bytes`` (pread size of the scan, 8 MiB) and,
    for GZIP-compressed files, ``restart_bytes`` (decompressed bytes between restart
    points inside a gzip member, 1 MiB: the most a record read inflates besides itself).
    """

    name: ClassVar[str] = "tfrecord"
    extensions: ClassVar[tuple[str, ...]] = (
        ".tfrecord",
        ".tfrecords",
        ".tfrecord.gz",
        ".tfrecords.gz",
    )
    options: ClassVar[tuple[str, ...]] = ("verify", "buffer_bytes", "restart_bytes")

    def __init__(self, path, **options: Any) -> None:
        super().__init__(path, **options)
        self.verify = bool(self.opts.get("verify", True))
        self.buffer_bytes = int(self.opts.get("buffer_bytes", SCAN_BYTES))
        if self.buffer_bytes < 4096:
            raise ConfigError(f"buffer_bytes must be >= 4096, not {self.buffer_bytes}")
        self.restart_bytes = self.opts.get("restart_bytes", RESTART_BYTES)
        if isinstance(self.restart_bytes, bool) or not isinstance(self.restart_bytes, int):
            raise ConfigError(f"restart_bytes must be an integer, not {self.restart_bytes!r}")
        if self.restart_bytes < 65536:
            raise ConfigError(f"restart_bytes must be >= 65536, not {self.restart_bytes}")

    def sidecar_key(self) -> str:
        # How the scan reads does not change the index: one sidecar for every setting;
        # the restart spacing does (for gzip files).
        if self.restart_bytes != RESTART_BYTES:
            return f"{self.name}-v1-r{self.restart_bytes}"
        return f"{self.name}-v1"

    def build_index(self, progress: bool = False) -> Index:
        gz = [is_gzip(p) for p in self.files]
        if any(gz):
            if not all(gz):
                plain = self.files[gz.index(False)]
                raise UnsupportedFormatError(
                    plain,
                    f"uncompressed TFRecord among GZIP-compressed ones ({self.files[gz.index(True)]}); "
                    "open them as two datasets, or compress them alike",
                )
            return self._build_gzip_index()
        file_ids, offsets, lengths = [], [], []
        reads = scanned = 0
        for fid, path in enumerate(self.files):
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

    def _build_gzip_index(self) -> Index:
        file_ids, offsets, lengths = [], [], []
        span, at, size, out, bits, win, windows = [], [], [], [], [], [], []
        base = wbase = 0
        members = reads = scanned = stream = 0
        for fid, path in enumerate(self.files):
            r = _core.scan_gzip_tfrecord(path, self.restart_bytes, self.buffer_bytes, self.verify)
            seg = np.asarray(r["segment"], dtype=np.int64)
            start, end = np.asarray(r["start"]), np.asarray(r["end"])
            file_ids.append(np.full(len(seg), fid, dtype=np.int32))
            offsets.append(start[seg])
            lengths.append((end - start)[seg])
            span.append(seg + base)
            at.append(np.asarray(r["at"]))
            size.append(np.asarray(r["length"]))
            out.append(np.asarray(r["out"]))
            bits.append(np.asarray(r["bits"], dtype=np.int64))
            w = np.asarray(r["window"], dtype=np.int64)
            win.append(np.where(w >= 0, w + wbase, -1))
            windows.append(np.asarray(r["windows"]).reshape(-1, 32768))
            base += len(start)
            wbase += int(r["window_count"])
            members += int(r["members"])
            reads += int(r["reads"])
            scanned += int(r["bytes_read"])
            stream += int(r["stream_bytes"])
        packed = Packed(
            codec="gzip",
            span=np.concatenate(span),
            at=np.concatenate(at),
            size=np.concatenate(size),
            span_out=np.concatenate(out),
            span_arg=np.concatenate(bits),
            span_window=np.concatenate(win),
            windows=np.concatenate(windows),
            params={"restart_bytes": self.restart_bytes},
        )
        return Index(
            files=list(self.files),
            file_ids=np.concatenate(file_ids),
            offsets=np.concatenate(offsets),
            lengths=np.concatenate(lengths),
            packed=packed,
            meta={
                "compression": "gzip",
                "crc_verified": self.verify,
                "gzip_members": members,
                "restart_points": len(packed.span_out),
                "restart_windows": len(packed.windows),
                "restart_bytes": self.restart_bytes,
                "decompressed_bytes": stream,
                "scan_preads": reads,
                "scan_bytes": scanned,
            },
        )
