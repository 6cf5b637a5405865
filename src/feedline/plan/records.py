# SPDX-License-Identifier: Apache-2.0
"""Where samples live, as the planner needs it: ``extents(ids) -> (file_ids, offsets, lengths)``.

The planner never touches a file. :class:`IndexRecords` wraps a real
:class:`feedline.index.Index`; :class:`FlatRecords` describes fixed-size records
packed back to back (computed, so ``feedline plan`` can describe 50 M records without
an index). :mod:`feedline.plan.lmdb_model` adds the LMDB page layout.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Records(Protocol):
    """Sample locations: ``n`` samples, ``extents(ids)``, and byte-size facts."""

    n: int

    def extents(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...

    @property
    def max_length(self) -> int: ...

    @property
    def mean_length(self) -> float: ...


def top_bytes(records, k: int) -> int:
    """The most bytes *k* records of *records* can hold (a batch, a window, a share:
    ``records.top_bytes(k)``, the sum of the longest; *k* times the longest record for
    Records that do not say)."""
    top = getattr(records, "top_bytes", None)
    return int(top(k)) if top is not None else int(k) * int(records.max_length)


#: the longest records summed exactly up to this many (batches, steps of a window) ...
TOP_EXACT = 1 << 16
#: ... and beyond, bounded by a histogram of lengths in bins this much apart (log scale)
TOP_BIN_RATIO = 1.02


class TopLengths:
    """The most bytes *k* records can hold: the sum of the *k* longest lengths (what a
    batch, a window or a share is sized for: *k* times the longest record is as safe
    and, with lengths that vary, far more: one 15 MB JPEG among 110 KB ones made a
    batch of 64 "need" 960 MB). Exact up to :data:`TOP_EXACT` records; beyond, an upper
    bound from a histogram of lengths in bins :data:`TOP_BIN_RATIO` apart: whole bins at
    their exact bytes, the last one's records at its ceiling (at most 2% over for
    records of 50 bytes and more). Past *n* (a circular last step repeats records):
    each record once per whole *n*, then the longest. O(n) to build (no sort), O(log
    bins) per question; safe to share between threads."""

    def __init__(self, lengths) -> None:
        self._lengths = lengths  # built at the first question
        self.n = len(lengths)
        self._built: tuple | None = None
        self._lock = threading.Lock()

    def _build(self) -> tuple:
        ln = np.asarray(self._lengths).ravel()
        n = self.n
        h = min(n, TOP_EXACT)
        head = np.sort(np.partition(ln, n - h)[n - h :] if h < n else ln)[::-1]
        cum = np.concatenate([[0], np.cumsum(head, dtype=np.int64)])
        last = int(head[-1]) if h else 0
        bins = None
        if h < n:  # a histogram, longest bins first: records and their exact bytes per bin
            b = np.log(np.maximum(ln, 1), dtype=np.float64) / np.log(TOP_BIN_RATIO)
            b = b.astype(np.int64)  # floor: lengths are >= 1 here
            top_bin = int(b.max())
            at = top_bin - b  # 0 for the longest bin: bincount orders them longest first
            counts = np.bincount(at).astype(np.int64)
            sums = np.bincount(at, weights=ln).astype(np.int64)
            # a bin's records are shorter than the next bin's floor (+ float slack)
            edge = TOP_BIN_RATIO ** (top_bin - np.arange(len(counts)) + 1.0) * (1 + 1e-9)
            bins = (np.cumsum(counts), np.cumsum(sums), np.ceil(edge).astype(np.int64))
        return cum, last, bins, int(cum[-1]) if n == h else int(ln.sum(dtype=np.int64))

    def __call__(self, k: int) -> int:
        k = max(0, int(k))
        built = self._built
        if built is None:
            with self._lock:
                if self._built is None:
                    self._built = self._build()
                    self._lengths = None
                built = self._built
        cum, last, bins, total = built
        whole, k = divmod(k, self.n) if self.n else (0, 0)
        if k < len(cum):
            return whole * total + int(cum[k])
        h = len(cum) - 1
        exact = int(cum[h]) + (k - h) * last  # the rest at most the h-th longest
        if bins is not None:
            cnt, acc, ceiling = bins
            i = int(np.searchsorted(cnt, k))  # the bin the k-th longest record falls in
            before = (int(cnt[i - 1]), int(acc[i - 1])) if i else (0, 0)
            exact = min(exact, before[1] + (k - before[0]) * int(ceiling[i]))
        return whole * total + exact


class IndexRecords:
    """Records of an :class:`~feedline.index.Index` (or of plain columns)."""

    def __init__(self, file_ids, offsets, lengths) -> None:
        self.file_ids = np.asarray(file_ids)
        self.offsets = np.asarray(offsets)
        self.lengths = np.asarray(lengths)
        self.n = len(self.offsets)
        if len(self.file_ids) != self.n or len(self.lengths) != self.n:
            raise ValueError("file_ids, offsets and lengths must have equal lengths")
        self._max: int | None = None
        self._mean: float | None = None
        self._top: TopLengths | None = None
        self.meta: dict = {}
        #: samples per compressed span when spans hold runs of that many samples
        self.span_rows = 1

    @classmethod
    def from_index(cls, index) -> IndexRecords:
        rec = cls(index.file_ids, index.offsets, index.lengths)
        top = getattr(index, "_top_lengths", None)  # kept with the index: one per dataset
        if top is None or top.n != rec.n:
            top = TopLengths(index.lengths)
            with contextlib.suppress(AttributeError, TypeError):
                index._top_lengths = top
        rec._top = top
        packed = getattr(index, "packed", None)
        if packed is not None and rec.n:
            # compressed spans: every sample's extent is its whole span, read once for all
            # of them, so a sample costs its share of the span's stored bytes
            first = np.unique(packed.span, return_index=True)[1]
            rec._mean = float(np.asarray(index.lengths)[first].sum()) / rec.n
            # HDF5 chunks hold a fixed number of consecutive samples: tiles align to them
            rec.span_rows = int((getattr(index, "meta", None) or {}).get("chunk_rows") or 1)
        return rec

    def extents(self, ids):
        ids = np.asarray(ids, dtype=np.int64)
        return (
            self.file_ids[ids].astype(np.int64),
            self.offsets[ids].astype(np.int64),
            self.lengths[ids].astype(np.int64),
        )

    @property
    def max_length(self) -> int:
        if self._max is None:
            self._max = int(self.lengths.max()) if self.n else 0
        return self._max

    @property
    def mean_length(self) -> float:
        if self._mean is None:
            self._mean = float(self.lengths.mean()) if self.n else 0.0
        return self._mean

    def top_bytes(self, k: int) -> int:
        """At most the bytes of any *k* distinct records (:class:`TopLengths`)."""
        if self._top is None:
            self._top = TopLengths(self.lengths)
        return self._top(k)


class UniformRecords:
    """Base of record models whose records all have ``size`` bytes."""

    size: int

    @property
    def max_length(self) -> int:
        return self.size

    @property
    def mean_length(self) -> float:
        return float(self.size)

    def top_bytes(self, k: int) -> int:
        return max(0, int(k)) * self.size


@dataclass(frozen=True)
class FlatRecords(UniformRecords):
    """n records of *size* bytes back to back after a header, in one file."""

    n: int
    size: int
    header: int = 0

    def extents(self, ids):
        ids = np.asarray(ids, dtype=np.int64)
        return (
            np.zeros_like(ids),
            self.header + ids * self.size,
            np.full_like(ids, self.size),
        )


class CountOnly:
    """Only a sample count: plans of sample ids work, read plans do not."""

    def __init__(self, n: int) -> None:
        self.n = int(n)

    def extents(self, ids):
        from ..errors import ConfigError

        raise ConfigError("this plan was made from a sample count; give an Index to plan reads")

    max_length = 1
    mean_length = 1.0

    def top_bytes(self, k: int) -> int:
        return max(0, int(k))


def as_records(source) -> Records:
    """An Index, a Records object, ``(file_ids, offsets, lengths)`` or a count."""
    if isinstance(source, (int, np.integer)):
        return CountOnly(int(source))
    if isinstance(source, tuple) and len(source) == 3:
        return IndexRecords(*source)
    if isinstance(source, Records):
        return source
    if hasattr(source, "file_ids") and hasattr(source, "offsets") and hasattr(source, "lengths"):
        rec = IndexRecords.from_index(source)
        rec.meta = dict(getattr(source, "meta", {}) or {})  # tree facts for the seek model
        return rec
    raise TypeError(
        f"cannot plan over {type(source).__name__}: give an Index, Records, columns or a count"
    )
