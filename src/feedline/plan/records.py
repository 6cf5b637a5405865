# SPDX-License-Identifier: Apache-2.0
"""Where samples live, as the planner needs it: ``extents(ids) -> (file_ids, offsets, lengths)``.

The planner never touches a file. :class:`IndexRecords` wraps a real
:class:`feedline.index.Index`; :class:`FlatRecords` describes fixed-size records
packed back to back (computed, so ``feedline plan`` can describe 50 M records without
an index). :mod:`feedline.plan.lmdb_model` adds the LMDB page layout.
"""

from __future__ import annotations

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
        self.meta: dict = {}
        #: samples per compressed span when spans hold runs of that many samples
        self.span_rows = 1

    @classmethod
    def from_index(cls, index) -> IndexRecords:
        rec = cls(index.file_ids, index.offsets, index.lengths)
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


class UniformRecords:
    """Base of record models whose records all have ``size`` bytes."""

    size: int

    @property
    def max_length(self) -> int:
        return self.size

    @property
    def mean_length(self) -> float:
        return float(self.size)


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
