"""Epoch arithmetic and layouts: where each position of an epoch's base sequence goes.

DESIGN.md, "Epoch and step": the epoch's global order is cut into consecutive steps of
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


def sub_batch_bounds(step_len: int, P: int) -> np.ndarray:
    """Bounds of the P contiguous sub-batches of a step of *step_len* samples.

    Returns an int64 array of P+1 offsets; rank r takes ``[b[r], b[r+1])``. Sizes differ by
    at most one and the lower ranks take the extra samples.
    """
    if P < 1:
        raise ConfigError(f"world size must be >= 1, got {P}")
    r = np.arange(P + 1, dtype=np.int64)
    q, e = divmod(int(step_len), P)
    return r * q + np.minimum(r, e)


def _bound(L, P, r):
    """Offset of rank r's sub-batch in a step of length L (vectorised)."""
    return r * (L // P) + np.minimum(r, L % P)


def _rank_of(o, L, P):
    """(rank, index in sub-batch) of offset o in a step of length L (vectorised)."""
    q, e = L // P, L % P
    big = e * (q + 1)
    lo = o < big
    qs = np.maximum(q, 1)
    r = np.where(lo, o // (q + 1), e + (o - big) // qs)
    j = np.where(lo, o % (q + 1), (o - big) % qs)
    return r, j


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
        return base + int(_bound(L, self.P, rank)), base + int(_bound(L, self.P, rank + 1))

    def to_stream(self, p: np.ndarray, layout: str) -> np.ndarray:
        """Base-sequence positions q of global positions p under *layout*."""
        p = np.asarray(p, dtype=np.int64)
        if layout == "row":
            return p
        B, P, S = self.B, self.P, self.steps
        s, o = np.divmod(p, B)
        if layout == "skip":
            r, j = _rank_of(o, self.step_len(s), P)
            return s * B + r + P * j
        if layout == "rank":
            r, j = _rank_of(o, self.step_len(s), P)
            full = B // P + (r < B % P)
            start = (S - 1) * _bound(B, P, r) + _bound(self.last, P, r)
            return start + s * full + j
        if layout == "node":
            r, _ = _rank_of(o, self.step_len(s), P)
            node = r * self.M // P
            a = -(-node * P // self.M)  # first rank of the node
            b = -(-(node + 1) * P // self.M)
            start = (S - 1) * _bound(B, P, a) + _bound(self.last, P, a)
            per_step = _bound(B, P, b) - _bound(B, P, a)
            return start + s * per_step + (o - _bound(self.step_len(s), P, a))
        if layout == "column":
            col_start = o * (S - 1) + np.minimum(o, self.last)
            return col_start + s
        raise ConfigError(f"unknown layout {layout!r}; known: {LAYOUTS}")
