# SPDX-License-Identifier: Apache-2.0
"""Epoch arithmetic and layouts: where each position of an epoch's base sequence goes.

docs/planner.md, "Epoch and step": the epoch's global order is cut into consecutive steps of
B; each step into P contiguous sub-batches whose sizes differ by at most one, lower
ranks taking the extra. A *layout* maps a global position ``p = s·B + o`` (step s,
offset o) to a position q of the assignment's base sequence Q, in O(1) per position:

- ``row``: q = p (strided, global, memory).
- ``skip``: within each step, rank r takes q = s·B + r + P·j (read one, skip P-1).
- ``rank``: rank r owns the contiguous range of Q it consumes over the epoch.
- ``node``: node m owns one contiguous range of Q, consumed step by step (its ranks'
  sub-batches in rank order), so a node's future steps are one contiguous run.
- ``column``: column c of the batch reads its own contiguous run of Q, one per step;
  independent of P.
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError

LAYOUTS = ("row", "skip", "rank", "node", "column")


def num_steps(n: int, batch_size: int, drop_last: bool = False) -> int:
    """Steps in an epoch of *n* samples: ceil(n / B), or floor with *drop_last*."""
    if batch_size < 1:
        raise ConfigError(f"batch size must be >= 1, got {batch_size}")
    if n < 0:
        raise ConfigError(f"sample count must be >= 0, got {n}")
    return n // batch_size if drop_last else -(-n // batch_size)


# ------------------------------------------------------------------ even splits
# n items cut into p contiguous parts, two conventions (they give different splits):
# - *even*: the first n % p parts take one item more (sub-batches of a step, a node's
#   readers' shares, benchmark shards): :func:`even_start`, :func:`even_split`,
#   :func:`even_part`;
# - *proportional*: part i starts at floor(n·i/p) (:func:`floor_start`), or at ceil(n·i/p)
#   (:func:`ceil_start`, the ranks of node m when rank r is on node floor(r·M/P)).


def even_start(n, parts, i):
    """First item of part *i* of *n* items cut into *parts* contiguous parts whose sizes
    differ by at most one, the lower parts taking the extra (``i = parts``: *n*).

    Vectorised: *n* and *i* may be integers or int64 arrays.
    """
    return i * (n // parts) + np.minimum(i, n % parts)


def even_split(n: int, parts: int, i: int) -> tuple[int, int]:
    """``[start, stop)`` of part *i* of :func:`even_start`'s split, as Python ints."""
    return int(even_start(n, parts, i)), int(even_start(n, parts, i + 1))


def even_part(x, n, parts):
    """``(part, index in part)`` of item *x* in :func:`even_start`'s split (vectorised)."""
    q, e = n // parts, n % parts
    big = e * (q + 1)
    lo = x < big
    qs = np.maximum(q, 1)
    part = np.where(lo, x // (q + 1), e + (x - big) // qs)
    j = np.where(lo, x % (q + 1), (x - big) % qs)
    return part, j


def floor_start(n, parts, i):
    """First item of part *i* when *n* items are cut at floor(n·i / parts) (vectorised)."""
    return n * i // parts


def ceil_start(n, parts, i):
    """First item of part *i* when *n* items are cut at ceil(n·i / parts) (vectorised):
    the items x with ``x * parts // n == i``."""
    return -(-n * i // parts)


def sub_batch_bounds(step_len: int, P: int) -> np.ndarray:
    """Bounds of the P contiguous sub-batches of a step of *step_len* samples.

    Returns an int64 array of P+1 offsets; rank r takes ``[b[r], b[r+1])``. Sizes differ by
    at most one and the lower ranks take the extra samples.
    """
    if P < 1:
        raise ConfigError(f"world size must be >= 1, got {P}")
    return even_start(int(step_len), P, np.arange(P + 1, dtype=np.int64))


class Geometry:
    """Steps of an epoch: T positions delivered, batch B, world size P.

    ``T`` is N (exactly-once), ``S·B`` with ``circular`` (wrapping), or ``S·B`` with
    ``drop_last`` (the tail dropped).
    """

    def __init__(
        self, n: int, batch_size: int, P: int, *, drop_last: bool, circular: bool, nodes: int = 1
    ) -> None:
        self.n, self.B, self.P, self.M = n, batch_size, P, nodes
        self.steps = num_steps(n, batch_size, drop_last)
        self.total = self.steps * batch_size if (circular or drop_last) else n
        self.last = self.total - (self.steps - 1) * batch_size if self.steps else 0

    def step_len(self, step) -> np.ndarray:
        s = np.asarray(step, dtype=np.int64)
        return np.minimum(self.B, self.total - s * self.B)

    def rank_range(self, step: int, rank: int) -> tuple[int, int]:
        """Global positions ``[lo, hi)`` of *rank*'s sub-batch at *step*."""
        L = int(self.step_len(step))
        base = step * self.B
        lo, hi = even_split(L, self.P, rank)
        return base + lo, base + hi

    def to_stream(self, p: np.ndarray, layout: str) -> np.ndarray:
        """Base-sequence positions q of global positions p under *layout*."""
        p = np.asarray(p, dtype=np.int64)
        if layout == "row":
            return p
        B, P, S = self.B, self.P, self.steps
        s, o = np.divmod(p, B)
        if layout == "skip":
            r, j = even_part(o, self.step_len(s), P)
            return s * B + r + P * j
        if layout == "rank":
            r, j = even_part(o, self.step_len(s), P)
            first = even_start(B, P, r)
            start = (S - 1) * first + even_start(self.last, P, r)
            return start + s * (even_start(B, P, r + 1) - first) + j
        if layout == "node":
            r, _ = even_part(o, self.step_len(s), P)
            node = r * self.M // P
            a = ceil_start(P, self.M, node)  # first rank of the node
            b = ceil_start(P, self.M, node + 1)
            start = (S - 1) * even_start(B, P, a) + even_start(self.last, P, a)
            per_step = even_start(B, P, b) - even_start(B, P, a)
            return start + s * per_step + (o - even_start(self.step_len(s), P, a))
        if layout == "column":
            col_start = o * (S - 1) + np.minimum(o, self.last)
            return col_start + s
        raise ConfigError(f"unknown layout {layout!r}; known: {LAYOUTS}")
