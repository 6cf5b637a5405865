"""Unpacking compressed spans into records (HDF5 filtered chunks, gzip TFRecord segments).

The read path is the same as for every format: the planner reads each sample's extent,
which for compressed data is its span's stored bytes — shared by all samples of the
span, so the coalesced read of a window fetches a span once however many of its samples
the window holds. A raw batch therefore holds one copy of the span per sample;
:class:`Unpacker` unpacks each distinct span of the batch once (natively, GIL released)
and cuts the records out. A small cache of recently unpacked spans (``unpack_cache_mib``)
lets batches that share a span — samples of one chunk spread over consecutive batches by
a shuffle window — unpack it once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from .. import _core, defaults
from ..errors import CorruptDataError
from ..index import Index, Packed

_WHAT = {"hdf5": "chunk", "gzip": "gzip segment"}


def _gather(buf: np.ndarray, src: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    from ..pipeline.reader import gather

    return gather(buf, src, lengths)


class Unpacker:
    """Turns raw batches of stored spans into records, for one :class:`Index`."""

    def __init__(self, index: Index, cache_bytes: int | None = None) -> None:
        if index.packed is None:
            raise ValueError("Unpacker needs an index of compressed data")
        self.index = index
        self.packed: Packed = index.packed
        if cache_bytes is None:
            cache_bytes = int(defaults.get("unpack_cache_mib")) << 20
        self.cache_bytes = int(cache_bytes)
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self._cached = 0
        self._lock = threading.Lock()
        self.spans_unpacked = 0
        self.bytes_unpacked = 0
        self.cache_hits = 0
        p = self.packed
        if p.codec == "hdf5":
            self._filters = np.asarray(p.params.get("filters", []), dtype=np.int64)
            self._itemsize = int(p.params.get("itemsize", 1))
        elif p.codec != "gzip":
            raise ValueError(f"unknown codec {p.codec!r}")
        self._windows = np.ascontiguousarray(p.windows, dtype=np.uint8).reshape(-1, 32768)

    def unpack(
        self, raw: np.ndarray, lengths: np.ndarray, ids: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(records, record_lengths)`` of a raw batch (each sample's span, concatenated)."""
        p = self.packed
        raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
        ids = np.asarray(ids, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        if len(ids) == 0:
            return np.zeros(0, dtype=np.uint8), np.zeros(0, dtype=np.int64)
        starts = np.zeros(len(ids), dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        spans = p.span[ids]
        uniq, first, inverse = np.unique(spans, return_index=True, return_inverse=True)
        out_sizes = p.span_out[uniq]
        out_starts = np.zeros(len(uniq), dtype=np.int64)
        np.cumsum(out_sizes[:-1], out=out_starts[1:])
        buf = np.empty(int(out_sizes.sum()), dtype=np.uint8)
        todo = self._from_cache(uniq, buf, out_starts, out_sizes)
        if len(todo):
            self._unpack(raw, starts[first[todo]], lengths[first[todo]], ids[first[todo]],
                         uniq[todo], buf, out_starts[todo], out_sizes[todo])
            self._to_cache(uniq[todo], buf, out_starts[todo], out_sizes[todo])
        size = p.size[ids]
        src = out_starts[inverse.reshape(-1)] + p.at[ids]
        if p.codec == "gzip":  # deflate has no checksum of its own inside a member
            bad = int(_core.check_tfrecord_crcs(buf, src, size))
            if bad >= 0:
                sid = int(ids[bad])
                fid, off, ln = self.index.extent(sid)
                raise CorruptDataError(
                    self.index.files[fid],
                    off,
                    f"sample {sid}: record of {int(size[bad])} bytes unpacked from gzip segment "
                    f"{int(spans[bad])} ({ln} stored bytes) fails its TFRecord CRC: the file "
                    "changed or is damaged",
                )
        return _gather(buf, src, size), size

    def _unpack(self, raw, starts, sizes, ids, spans, buf, out_starts, out_sizes) -> None:
        p = self.packed
        if p.codec == "hdf5":
            fault = _core.unfilter_chunks(
                raw, starts, sizes, p.span_arg[spans], self._filters, self._itemsize,
                buf, out_starts, out_sizes,
            )
        else:
            fault = _core.inflate_segments(
                raw, starts, sizes, p.span_arg[spans], p.span_window[spans], self._windows,
                buf, out_starts, out_sizes,
            )
        if fault is not None:
            j, reason = fault
            sid = int(ids[j])
            fid, off, ln = self.index.extent(sid)
            raise CorruptDataError(
                self.index.files[fid],
                off,
                f"sample {sid}: {_WHAT[p.codec]} {int(spans[j])} of {ln} stored bytes: {reason}",
            )
        with self._lock:
            self.spans_unpacked += len(spans)
            self.bytes_unpacked += int(out_sizes.sum())

    def _from_cache(self, uniq, buf, out_starts, out_sizes) -> np.ndarray:
        """Copy cached spans into *buf*; return the positions (in *uniq*) still to unpack."""
        if self.cache_bytes <= 0:
            return np.arange(len(uniq))
        todo = []
        with self._lock:
            for j, s in enumerate(uniq.tolist()):
                hit = self._cache.get(s)
                if hit is None:
                    todo.append(j)
                    continue
                self._cache.move_to_end(s)
                a = int(out_starts[j])
                buf[a : a + hit.size] = hit
                self.cache_hits += 1
        return np.asarray(todo, dtype=np.int64)

    def _to_cache(self, spans, buf, out_starts, out_sizes) -> None:
        if self.cache_bytes <= 0:
            return
        for s, a, n in zip(spans.tolist(), out_starts.tolist(), out_sizes.tolist(), strict=True):
            if n > self.cache_bytes // 4:
                continue  # a span this large would evict everything else
            copy = buf[a : a + n].copy()
            with self._lock:
                if s in self._cache:
                    continue
                self._cache[s] = copy
                self._cached += n
                while self._cached > self.cache_bytes:
                    _, old = self._cache.popitem(last=False)
                    self._cached -= old.size

    def stats(self) -> dict[str, int]:
        """Spans unpacked, bytes they unpacked to, and cache hits so far."""
        with self._lock:
            return {
                "spans_unpacked": self.spans_unpacked,
                "bytes_unpacked": self.bytes_unpacked,
                "cache_hits": self.cache_hits,
            }
