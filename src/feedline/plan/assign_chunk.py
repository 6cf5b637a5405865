# SPDX-License-Identifier: Apache-2.0
"""``chunk(g)``: the asynchronous-I/O paper's shuffle (§III). The samples are cut into
groups of g contiguous samples; the groups are permuted globally each epoch and the
samples of each group are permuted locally (the shuffle inside the I/O buffer). Each
group is one contiguous read.

Layout ``rank`` gives each rank a contiguous share of the shuffled groups, consumed front
to back — exactly the paper's pattern, dependent on P. Layout ``column`` (feedline)
lays the same sequence out column by column over the global batch, so batch column c
reads its own run of groups one sample per step: each group is still read by one rank,
a global batch mixes B different places, and the order does not depend on P (exact
resume at any world size). The price of ``column`` is memory: a rank holds one group
per batch column it serves (b·g samples for a sub-batch of b), against one buffer of g
in ``rank`` layout.

In the ``column`` layout the groups are cut per column rather than over the flat
sequence: column c's run of S (or S-1) steps is made of slots of g steps, each filled
with one whole group, so windows of a multiple of g steps read whole groups and never a
fraction of one. Full slots take the N // g... full groups in a keyed order; each
column's short last slot (sizes (S-1) mod g or S mod g, at most two kinds) takes one of
the short groups cut from the end of the file.

With ``chunk_bytes`` (the feedline preset) the column layout reads *tiles* instead:
a group per column is only g samples, too small a read (the RL floor picks g <= 64,
often 4: 12-200 KB), so m = B / MIN_REGIONS adjacent columns share one contiguous,
locally shuffled tile of m·g samples sized by bytes (:func:`tile_shape`,
:class:`TiledColumnStream`). Adjacent columns belong to the same rank and node, so a
tile is one read of MiBs; a global batch then mixes MIN_REGIONS places instead of B.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ._perm import derive_key, permute, subkeys
from .layout import even_part, even_start
from .rl import chunk_size, rl_grouped
from .stream import Assignment, GroupSlots

#: With ``chunk_bytes``, the B batch columns are cut into this many blocks (of about
#: B // MIN_REGIONS columns), so that a global batch draws from this many places.
MIN_REGIONS = 16
#: A tile is made of sub-tiles of this many adjacent columns, each shuffled locally and
#: laid out in column order, so that any run of columns (a node's share) is one run of
#: the file. A sub-tile straddling two nodes is read by both: 8 divides the per-node
#: columns of most jobs (B / M with power-of-two sub-batches), which the order cannot know.
SUBTILE_COLUMNS = 8
#: g is sized so that this many adjacent columns (a node's share of a block, at least,
#: in most jobs) over g steps reach ``chunk_bytes``.
NODE_COLUMNS = 64


class ChunkStream:
    def __init__(self, n: int, g: int, key: np.uint64) -> None:
        self.n, self.g = n, g
        self.slots = GroupSlots(n, g, key)
        self.inner = derive_key(int(key), 0x43484E4B)  # "CHNK": independent local keys

    def take(self, q: np.ndarray) -> np.ndarray:
        _, group, off = self.slots.locate(q)
        size = self.slots.size_of_group(group)
        return group * self.g + permute(off, size, subkeys(self.inner, group))


class ColumnChunkStream:
    """Chunk shuffle laid out per batch column (see the module docstring).

    ``take(q)`` expects base positions of the ``column`` layout, ``q = C_c + t`` with
    ``C_c = c·(S-1) + min(c, L)`` (column c, step t), and returns ids modulo N (so
    Caffe's circular last step wraps consistently).
    """

    wraps = True

    def __init__(self, n: int, g: int, key: np.uint64, geo) -> None:
        self.n, self.g, self.key = n, g, key
        self.S, self.B = geo.steps, geo.B
        self.L = geo.last  # columns c < L run S steps, the others S - 1
        self.total = geo.total
        S, L, B = self.S, self.L, self.B
        # per column class (long: S steps, short: S-1): full slots and the short slot's size
        self.fa, self.ra = divmod(S, g)
        self.fb, self.rb = divmod(max(S - 1, 0), g)
        self.full = L * self.fa + (B - L) * self.fb if S else 0
        self.base_a = self.full * g  # short groups of size ra, then of size rb
        self.base_b = self.base_a + (L * self.ra if self.ra else 0)
        self.k_full = derive_key(int(key), 0x46554C4C)  # "FULL"
        self.k_a = derive_key(int(key), 0x5348524131)
        self.k_b = derive_key(int(key), 0x5348524232)
        self.inner = derive_key(int(key), 0x43484E4B)

    def take(self, q: np.ndarray) -> np.ndarray:
        q = np.asarray(q, dtype=np.int64)
        S, L, g = self.S, self.L, self.g
        long_ = q < L * S
        c = np.where(long_, q // max(S, 1), L + (q - L * S) // max(S - 1, 1))
        t = np.where(long_, q - c * S, q - L * S - (c - L) * (S - 1))
        k, u = np.divmod(t, g)
        f = np.where(long_, self.fa, self.fb)
        is_full = k < f
        out = np.empty_like(q)
        if is_full.any():
            idx = np.where(long_, c * self.fa, L * self.fa + (c - L) * self.fb) + k
            sel = is_full
            grp = permute(idx[sel], self.full, self.k_full)
            out[sel] = grp * g + permute(u[sel], g, subkeys(self.inner, grp))
        a = ~is_full & long_
        if a.any():  # short slot of a long column: one of L groups of size ra
            grp = permute(c[a], L, self.k_a)
            start = self.base_a + grp * self.ra
            out[a] = start + permute(u[a], self.ra, subkeys(self.inner, start + self.n))
        b = ~is_full & ~long_
        if b.any():
            grp = permute(c[b] - L, self.B - L, self.k_b)
            start = self.base_b + grp * self.rb
            out[b] = start + permute(u[b], self.rb, subkeys(self.inner, start + self.n))
        return out % self.n if self.n else out


class TiledColumnStream:
    """Column layout with tiles: m adjacent batch columns over g steps share one
    contiguous run of the file (``strategy.chunk_bytes``; see :func:`tile_shape`).

    Steps are cut into K = ceil(S/g) rows of g steps; the last row is ragged (long
    columns have hL = S - (K-1)·g steps in it, short ones hL - 1). Columns are cut into
    nb blocks of q or q+1 adjacent columns (the first r = B mod nb blocks are the wider
    ones). Tile (row k, block b) is one contiguous run of the file whose cells
    are numbered row-major (step, then column) and locally permuted. A short last step
    (L < B) is a row of its own: the layout splits it among the ranks by its own length
    L, so its cells would otherwise be scattered through other ranks' tiles. The file
    holds the full rows' wide tiles, then their narrow tiles (each kind in a keyed
    order), then the last row's nb tiles and the last step's nb tiles (each in a keyed
    order, sizes vary). Like :class:`ColumnChunkStream`, ``take`` expects column-layout
    base positions and returns ids modulo N.
    """

    wraps = True

    def __init__(self, n: int, g: int, nb: int, key: np.uint64, geo, c: int = 8) -> None:
        self.n, self.g, self.nb, self.key, self.c = n, g, nb, key, max(1, c)
        S, B, L = geo.steps, geo.B, geo.last
        self.S, self.B, self.L = S, B, L
        self.total = geo.total
        self.K = -(-S // g) if S else 0
        self.m = -(-B // nb)  # widest block
        self.q, self.r = q, r = divmod(B, nb)
        self.R = R = max(self.K - 1, 0)  # full rows
        self.hL = S - R * g
        self.base_b = R * r * (q + 1) * g
        self.base_c = self.base_b + R * (nb - r) * q * g
        b = np.arange(nb, dtype=np.int64)
        first = even_start(B, nb, b)
        w = even_start(B, nb, b + 1) - first
        # a short last step (L < B columns) is its own row of tiles: the layout splits it
        # among ranks by its own length, so it must not be scattered through the others
        self.split = L < B
        self.h_last = self.hL - 1 if self.split else self.hL
        self.k_a = derive_key(int(key), 0x54494C4541)  # "TILEA"
        self.k_b = derive_key(int(key), 0x54494C4542)
        self.inner = derive_key(int(key), 0x43484E4B)
        # file starts of the full rows' tiles (R·nb of them: a small table)
        na, nn = R * r, R * (nb - r)
        self.start_a = permute(np.arange(na, dtype=np.int64), na, self.k_a) * ((q + 1) * g)
        self.start_b = self.base_b + permute(np.arange(nn, dtype=np.int64), nn, self.k_b) * (q * g)
        base = self.base_c
        self.size_c, self.start_c, base = self._row(w * self.h_last, base, 0x54494C4543)
        size_d = np.clip(L - first, 0, w) if self.split else np.zeros(nb, dtype=np.int64)
        self.size_d, self.start_d, base = self._row(size_d, base, 0x54494C4544)
        if base != self.total:  # pragma: no cover
            raise AssertionError("tiles do not cover the epoch")

    def _row(self, size: np.ndarray, base: int, tag: int):
        """Sizes and file starts of one row's nb tiles placed in a keyed order from *base*."""
        nb = self.nb
        size = np.asarray(size, dtype=np.int64)
        slot = permute(np.arange(nb, dtype=np.int64), nb, derive_key(int(self.key), tag))
        by_slot = np.empty(nb, dtype=np.int64)
        by_slot[slot] = size
        starts = np.zeros(nb, dtype=np.int64)
        np.cumsum(by_slot[:-1], out=starts[1:])
        return size, base + starts[slot], base + int(size.sum())

    @property
    def tile(self) -> int:
        """Samples of a full sub-tile, the unit of local shuffling (min(c, m)·min(g, S))."""
        return min(self.c, self.m) * min(self.g, max(self.S, 1))

    def take(self, pos: np.ndarray) -> np.ndarray:
        pos = np.asarray(pos, dtype=np.int64)
        S, L, g, q, r, nb, cs = self.S, self.L, self.g, self.q, self.r, self.nb, self.c
        long_ = pos < L * S
        c = np.where(long_, pos // max(S, 1), L + (pos - L * S) // max(S - 1, 1))
        t = np.where(long_, pos - c * S, pos - L * S - (c - L) * (S - 1))
        k, u = np.divmod(t, g)
        b, j = even_part(c, self.B, nb)  # block of column c, column inside the block
        wide = b < r  # the first r blocks are one column wider
        w = q + wide  # columns of the tile's row
        start = np.empty_like(pos)  # file start of the tile
        h = np.full_like(pos, g)  # its height in steps
        full = k < self.R
        sel = full & wide
        start[sel] = self.start_a[k[sel] * r + b[sel]]
        sel = full & ~wide
        start[sel] = self.start_b[k[sel] * (nb - r) + (b[sel] - r)]
        final = (t == S - 1) & self.split
        sel = ~full & ~final
        start[sel], h[sel] = self.start_c[b[sel]], self.h_last
        start[final], h[final], u[final] = self.start_d[b[final]], 1, 0
        w[final] = self.size_d[b[final]]  # the long columns of the block
        # sub-tiles of cs adjacent columns, in column order: any run of columns is one
        # run of the file; each sub-tile is shuffled locally
        sub = j // cs
        width = np.minimum(cs, w - sub * cs)
        first = start + sub * cs * h
        local = u * width + (j - sub * cs)
        out = first + permute(local, width * h, subkeys(self.inner, first))
        return out % self.n if self.n else out


def _mean_length(records) -> float | None:
    """Mean record length in bytes, or None when the plan was made from a bare count."""
    if records is None:
        return None
    from .records import CountOnly

    if isinstance(records, CountOnly):
        return None
    return float(records.mean_length)


def column_shape(n: int, strategy, geo, records=None) -> tuple[int, int]:
    """``(g, nb)`` of the column layout: slot height g (steps), tiles per row nb.

    Without ``strategy.chunk_bytes`` (or without record lengths) this is
    ``(chunk_size(n, strategy), B)``: one group of g samples per column slot. With it, the
    B batch columns are cut into nb < B blocks of adjacent columns and each block's g
    steps are one contiguous tile (see :func:`tile_shape`).
    """
    S = int(geo.steps) if geo is not None else 0
    B = int(geo.B) if geo is not None else 1
    return tile_shape(n, strategy, B, S, _mean_length(records))


@lru_cache(maxsize=256)
def tile_shape(n: int, strategy, B: int, S: int, mean_len: float | None) -> tuple[int, int]:
    """The byte sizing rule of the column layout (docs/planner.md, "Tiles"): ``(g, nb)``.

    The B columns of the global batch are cut into nb = min(MIN_REGIONS, B) blocks of
    m = ceil(B / nb) adjacent columns: a global batch draws from nb places of the file.
    A tile is one block over g steps, m·g samples in one contiguous run of the file,
    made of sub-tiles of SUBTILE_COLUMNS columns in column order, each locally shuffled
    (so a node's columns of a block are one read). g = ceil(T / min(m, NODE_COLUMNS))
    with T = ceil(chunk_bytes / mean_len): a node holding NODE_COLUMNS columns of a
    block reads at least ``chunk_bytes`` at once. At most S; ``strategy.chunk`` when
    given. While the RL of a sub-tile (:func:`feedline.plan.rl.rl_grouped`, local
    shuffle) is under ``rl_floor``, T doubles (RL is U-shaped in the group size). A pure
    function of (n, strategy, B, S, mean record length): world-size independent, like
    the layout.
    """
    if not strategy.chunk_bytes or mean_len is None or S < 1 or n <= 1 or B <= 1:
        return chunk_size(n, strategy), B
    nb = min(MIN_REGIONS, B)
    m = -(-B // nb)
    T = max(1, min(int(np.ceil(strategy.chunk_bytes / max(mean_len, 1.0))), n))
    while True:
        g = max(1, min(strategy.chunk or -(-T // min(m, NODE_COLUMNS)), S))
        size = min(min(m, SUBTILE_COLUMNS) * g, n)
        if (
            strategy.rl_floor <= 0
            or strategy.chunk
            or size >= n
            or g >= S
            or rl_grouped(n, size, local_shuffle=True) >= strategy.rl_floor
        ):
            return g, nb
        T = 2 * T


def _make(n: int, strategy, key, geo, records=None, epoch: int = 0):
    if strategy.chunk_layout == "column" and geo is not None and geo.steps:
        g, nb = column_shape(n, strategy, geo, records)
        if nb < geo.B:
            return TiledColumnStream(n, g, nb, key, geo, SUBTILE_COLUMNS)
        return ColumnChunkStream(n, g, key, geo)
    return ChunkStream(n, chunk_size(n, strategy), key)


ASSIGNMENT = Assignment(
    name="chunk",
    make=lambda n, strategy, key: ChunkStream(n, chunk_size(n, strategy), key),
    layout=lambda strategy: "column" if strategy.chunk_layout == "column" else "rank",
    world_independent=lambda strategy: strategy.chunk_layout == "column",
    make_geo=_make,
)
