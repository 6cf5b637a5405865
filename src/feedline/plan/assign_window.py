# SPDX-License-Identifier: Apache-2.0
"""``window``: large tiles in keyed order, each unit's share shuffled window by window.

The order the ``feedline`` preset plans (docs/planner.md, "The window shuffle"):

1. The records are cut into *tiles* of T contiguous records (T from ``chunk_bytes`` and
   the records' mean length); the tiles are put in keyed order. Concatenated, they form
   a virtual sequence V of all N ids.
2. Each *unit* — a node when the strategy aggregates (``region="node"``), else a rank —
   owns one contiguous range of V, exactly what it consumes over the epoch (the layouts
   ``node``/``rank`` of :mod:`feedline.plan.layout`, as for ``contiguous``).
3. The unit's range is cut into *windows* of w steps of its consumption, and every window
   is shuffled completely (a keyed permutation of its positions). The first w steps are
   cut finer, into windows of w/8, w/8, w/4 and w/2 steps (:func:`window_bounds`): the
   first window of an epoch is read before its first batch can be served, so a smaller
   one starts the epoch sooner, and the ones after it are read while it is consumed.

So a unit reads each window as about K = window / tile large extents (one per tile, a
tile cut at most at the window's two ends), a global batch draws from the current
windows of every unit (K random places of the file each), and the delivered order is a
pure function of (N, T, w, world, seed, epoch). It depends on P and M, like
``contiguous``: a resume at another world size re-cuts the remaining order
(:meth:`feedline.plan.Plan.resume`).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ._perm import permute, subkeys
from .layout import ceil_start, even_start
from .stream import Assignment, GroupSlots


def window_bounds(w: int, steps: int) -> np.ndarray:
    """The first step of every window of an epoch of *steps* steps with windows of *w*:
    0, w/8, w/4, w/2 (the first window cut finer, so less is read before the first batch),
    then every multiple of w. Sorted, unique, all < *steps* (at least ``[0]``)."""
    w, steps = max(1, int(w)), max(int(steps), 1)
    b = np.union1d([0, w >> 3, w >> 2, w >> 1], np.arange(w, steps, w, dtype=np.int64))
    return b[b < steps].astype(np.int64)


def window_sizes(w: int, steps: int) -> np.ndarray:
    """Steps of every window of an epoch (:func:`window_bounds`)."""
    b = window_bounds(w, steps)
    return np.diff(np.append(b, max(int(steps), 1)))


def weighted_window_steps(w: int, steps: int) -> float:
    """The window a sample is shuffled in, on average (sum of squares over sum of the
    window sizes): w for equal windows, a little less with the finer first one."""
    d = window_sizes(w, steps).astype(np.float64)
    return float((d * d).sum() / max(d.sum(), 1.0))


class WindowStream:
    """Q for the ``window`` assignment (see the module docstring).

    Parameters
    ----------
    n : int
        Samples.
    tile : int
        Records per tile T.
    window_steps : int
        Steps per window w.
    key : uint64
        The epoch's key.
    geo : Geometry
        The epoch's geometry (B, P, M, steps, last step length).
    unit : {"node", "rank"}
        What owns a range of V.
    """

    def __init__(self, n: int, tile: int, window_steps: int, key, geo, unit: str) -> None:
        self.n = n
        self.tile = max(1, int(tile))
        self.w = max(1, int(window_steps))
        self.unit = unit
        self.key = np.uint64(key)
        self._wkey = subkeys(self.key, np.array([2]))[0]
        B, P, S = geo.B, geo.P, geo.steps
        if unit == "node":
            firsts = ceil_start(P, geo.M, np.arange(geo.M + 1, dtype=np.int64))
        else:
            firsts = np.arange(P + 1, dtype=np.int64)
        # unit u owns Q positions [starts[u], starts[u+1]) (the layouts' arithmetic)
        self.starts = (
            (S - 1) * even_start(B, P, firsts) + even_start(geo.last, P, firsts)
            if S
            else (np.zeros(len(firsts), dtype=np.int64))
        )
        self.starts = np.asarray(self.starts, dtype=np.int64)
        #: samples a unit consumes per full step
        self.per_step = np.diff(even_start(B, P, firsts)).astype(np.int64)
        #: the first step of every window (:func:`window_bounds`)
        self.bounds = window_bounds(self.w, S)
        # where each window ends, in steps (the last: past every position of a unit)
        self._ends = np.append(self.bounds[1:], max(S, 1) + 1)
        self.slots = GroupSlots(n, self.tile, _balanced_key(n, self.tile, self.key, self.starts))

    def windows_of(self, u: int) -> tuple[np.ndarray, np.ndarray]:
        """Start positions in V and lengths of unit *u*'s windows."""
        a, b = int(self.starts[u]), int(self.starts[u + 1])
        if b <= a:
            z = np.zeros(0, dtype=np.int64)
            return z, z
        ps = max(int(self.per_step[u]), 1)
        edges = np.minimum(np.append(self.bounds * ps, b - a), b - a)
        edges = np.unique(edges)
        return a + edges[:-1], np.diff(edges)

    def pieces(self, v0: int, v1: int) -> tuple[np.ndarray, np.ndarray]:
        """Record ranges ``[lo, hi)`` (in V order) covering V positions ``[v0, v1)``."""
        if v1 <= v0:
            z = np.zeros(0, dtype=np.int64)
            return z, z
        s0 = int(self.slots.locate(np.array([v0]))[0][0])
        s1 = int(self.slots.locate(np.array([v1 - 1]))[0][0])
        slots = np.arange(s0, s1 + 1, dtype=np.int64)
        start = self.slots.slot_start(slots)
        group = self.slots.group_at(slots)
        size = self.slots.size_of_group(group)
        lo_v = np.maximum(start, v0)
        hi_v = np.minimum(start + size, v1)
        lo = group * self.tile + (lo_v - start)
        return lo, lo + (hi_v - lo_v)

    def v_of(self, q: np.ndarray) -> np.ndarray:
        """Positions in V of Q positions *q* (the window shuffle)."""
        q = np.asarray(q, dtype=np.int64)
        u = np.searchsorted(self.starts, q, side="right") - 1
        local = q - self.starts[u]
        ps = np.maximum(self.per_step[u], 1)
        length = self.starts[u + 1] - self.starts[u]
        k = np.searchsorted(self.bounds, local // ps, side="right") - 1
        ws = np.minimum(self.bounds[k] * ps, length)
        nxt = self._ends[k]
        size = np.minimum(nxt * ps, length) - ws
        wstart = self.starts[u] + ws
        keys = subkeys(self._wkey, wstart.astype(np.uint64))
        return wstart + permute(local - ws, size, keys)

    def take(self, q: np.ndarray) -> np.ndarray:
        v = self.v_of(q)
        _, group, off = self.slots.locate(v)
        return group * self.tile + off


#: keys tried for the tile order (see :func:`_balanced_key`)
TILE_KEYS = 16
#: positions permuted in one vectorised call when keys are compared (memory bound)
_PERMUTE_BATCH = 1 << 18
#: largest tile count whose correlation sums fit int64 (4 * G**3 / 3 < 2**63)
_EXACT_TILES = 1_500_000


def _balanced_key(n: int, tile: int, key, starts) -> np.uint64:
    return np.uint64(_balanced_key_cached(int(n), int(tile), int(key), tuple(starts.tolist())))


@lru_cache(maxsize=64)
def _balanced_key_cached(n: int, tile: int, key: int, starts_t: tuple) -> int:
    """The key of the tile order: of ``TILE_KEYS`` keyed permutations of the tiles, the
    one whose delivery times are least correlated with the disk order (O(tiles) each).

    A tile in slot s is delivered at the fraction of the epoch its V position has in its
    unit's range (``starts``: units consume their ranges side by side).

    A random order of G tiles has a rank correlation with the file of about 1/sqrt(G)
    (0.06 at 256 tiles) — visible on class-sorted data as a drift of classes across the
    epoch. Picking the most balanced of 16 orders keeps the correlation near 0.1/sqrt(G)
    at the price of 4 bits of the order's entropy. Pure: every rank picks the same.
    """
    from ._perm import permute

    starts = np.asarray(starts_t, dtype=np.int64)
    G = -(-n // tile) if n else 0
    keys = subkeys(np.uint64(key), np.arange(1, TILE_KEYS + 1, dtype=np.uint64))
    if G < 3:
        return int(keys[0])
    v = np.arange(G, dtype=np.int64) * tile
    u = np.searchsorted(starts, v, side="right") - 1
    u = np.clip(u, 0, len(starts) - 2)
    span = np.maximum(starts[u + 1] - starts[u], 1)
    t = (v - starts[u]) / span
    # the rank correlation of each order with the delivery times, in exact integers:
    # sum((r - m) * (p - m)) = sum(r * p) - G * m**2 with m = (G - 1) / 2, times 4
    r = np.argsort(np.argsort(t, kind="stable"), kind="stable").astype(np.int64)
    centre = G * (G - 1) ** 2
    per_call = max(1, _PERMUTE_BATCH // G)  # keys evaluated in one vectorised call
    best, best_c = int(keys[0]), None
    for k0 in range(0, TILE_KEYS, per_call):
        ks = keys[k0 : k0 + per_call]
        x = np.tile(np.arange(G, dtype=np.int64), len(ks))
        p = permute(x, G, np.repeat(ks, G)).reshape(len(ks), G)
        if G <= _EXACT_TILES:
            c = [abs(4 * int(v) - centre) for v in p @ r]
        else:  # sums beyond int64: Python integers
            c = [abs(4 * int(np.dot(row.astype(object), r.astype(object))) - centre) for row in p]
        for k, ck in zip(ks, c, strict=True):
            if best_c is None or ck < best_c:
                best, best_c = int(k), ck
    return best


def tile_records(strategy, mean_len: float | None, n: int) -> int:
    """Records per tile: ``chunk`` if given, else ``chunk_bytes`` / mean record length."""
    if strategy.chunk:
        return int(min(max(strategy.chunk, 1), max(n, 1)))
    if not mean_len or not strategy.chunk_bytes:
        return max(1, min(n, 64))
    return int(max(1, min(n, round(strategy.chunk_bytes / mean_len))))


ASSIGNMENT = Assignment(
    name="window",
    make=lambda n, strategy, key: WindowStream(n, max(strategy.chunk, 1), 1, key, None, "rank"),
    layout=lambda strategy: "node" if strategy.region == "node" else "rank",
    world_independent=lambda strategy: False,
)
