# SPDX-License-Identifier: Apache-2.0
"""Unpacking compressed spans into records (HDF5 filtered chunks, gzip TFRecord segments).

The read path is the same as for every format: the planner reads each sample's extent,
which for compressed data is its span's stored bytes — shared by all samples of the
span, so the coalesced read of a window fetches a span once however many of its samples
the window holds. A raw batch therefore holds one copy of the span per sample;
:class:`Unpacker` unpacks each distinct span of the batch once (natively, GIL released)
and copies the records out. A cache of recently unpacked spans (``unpack_cache_mib``,
no copies: views of the unpack buffers) lets batches that share a span — samples of one
chunk spread over consecutive batches by a shuffle window — unpack it once. gzip
segments are verified when unpacked: every record in them against its TFRecord CRC.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from .. import _core, defaults
from ..errors import CorruptDataError
from ..index import Index, Packed

_WHAT = {"hdf5": "chunk", "gzip": "gzip segment"}


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
        self._by_span: tuple[np.ndarray, np.ndarray] | None = None

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
        arrays: list[np.ndarray | None] = [None] * len(uniq)
        todo = self._from_cache(uniq, arrays)
        if len(todo):
            f = first[todo]
            self._unpack(raw, starts[f], lengths[f], ids[f], uniq[todo], arrays, todo)
        ready = [a for a in arrays if a is not None]
        if len(ready) != len(arrays):  # pragma: no cover - _unpack fills every span
            raise AssertionError("a span was not unpacked")
        size = p.size[ids]
        at = p.at[ids]
        out = np.empty(int(size.sum()), dtype=np.uint8)
        pos = 0
        for j, a, n in zip(inverse.reshape(-1).tolist(), at.tolist(), size.tolist(), strict=True):
            out[pos : pos + n] = ready[j][a : a + n]
            pos += n
        return out, size

    def _unpack(self, raw, starts, sizes, ids, spans, arrays, todo) -> None:
        """Unpack *spans* (their stored bytes at raw[starts:+sizes]) into *arrays*[todo]."""
        p = self.packed
        out_sizes = p.span_out[spans]
        out_starts = np.zeros(len(spans), dtype=np.int64)
        np.cumsum(out_sizes[:-1], out=out_starts[1:])
        buf = np.empty(int(out_sizes.sum()), dtype=np.uint8)
        if p.codec == "hdf5":
            fault = _core.unfilter_chunks(
                raw,
                starts,
                sizes,
                p.span_arg[spans],
                self._filters,
                self._itemsize,
                buf,
                out_starts,
                out_sizes,
            )
        else:
            fault = _core.inflate_segments(
                raw,
                starts,
                sizes,
                p.span_arg[spans],
                p.span_window[spans],
                self._windows,
                buf,
                out_starts,
                out_sizes,
            )
        if fault is not None:
            j, reason = fault
            self._corrupt(int(ids[j]), int(spans[j]), reason)
        views = [
            buf[a : a + n] for a, n in zip(out_starts.tolist(), out_sizes.tolist(), strict=True)
        ]
        if p.codec == "gzip":  # deflate has no checksum of its own inside a member
            for k, s in enumerate(spans.tolist()):
                recs = self._records_of(s)
                bad = int(_core.check_tfrecord_crcs(views[k], p.at[recs], p.size[recs]))
                if bad >= 0:
                    self._corrupt(
                        int(ids[k]),
                        s,
                        f"record {int(recs[bad])} of {int(p.size[recs[bad]])} bytes fails its "
                        "TFRecord CRC after unpacking: the file changed or is damaged",
                    )
        for k, j in enumerate(todo.tolist()):
            arrays[j] = views[k]
        with self._lock:
            self.spans_unpacked += len(spans)
            self.bytes_unpacked += int(out_sizes.sum())
        self._to_cache(spans, views)

    def _corrupt(self, sid: int, span: int, reason: str) -> None:
        fid, off, ln = self.index.extent(sid)
        raise CorruptDataError(
            self.index.files[fid],
            off,
            f"sample {sid}: {_WHAT[self.packed.codec]} {span} of {ln} stored bytes: {reason}",
        )

    def _records_of(self, span: int) -> np.ndarray:
        """Sample ids stored in *span* (an argsort of the span column, built once)."""
        if self._by_span is None:
            order = np.argsort(self.packed.span, kind="stable")
            bounds = np.searchsorted(
                self.packed.span[order], np.arange(len(self.packed.span_out) + 1)
            )
            self._by_span = (order, bounds)
        order, bounds = self._by_span
        return order[bounds[span] : bounds[span + 1]]

    def _from_cache(self, uniq: np.ndarray, arrays: list) -> np.ndarray:
        """Fill *arrays* with cached spans; return the positions (in *uniq*) to unpack."""
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
                arrays[j] = hit
                self.cache_hits += 1
        return np.asarray(todo, dtype=np.int64)

    def _to_cache(self, spans: np.ndarray, views: list[np.ndarray]) -> None:
        if self.cache_bytes <= 0:
            return
        with self._lock:
            for s, v in zip(spans.tolist(), views, strict=True):
                if v.size > self.cache_bytes // 4 or s in self._cache:
                    continue  # a span this large would evict everything else
                self._cache[s] = v  # a view: the batch's unpack buffer, no copy
                self._cached += v.size
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
