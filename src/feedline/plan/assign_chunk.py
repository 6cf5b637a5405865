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
"""

from __future__ import annotations

import numpy as np

from ._perm import derive_key, permute, subkeys
from .streams import Assignment, GroupSlots, register

DEFAULT_CHUNK = 64


class ChunkStream:
    def __init__(self, n: int, g: int, key: np.uint64) -> None:
        self.n, self.g = n, g
        self.slots = GroupSlots(n, g, key)
        self.inner = derive_key(int(key), 0x43484E4B)  # "CHNK": independent local keys

    def take(self, q: np.ndarray) -> np.ndarray:
        _, group, off = self.slots.locate(q)
        size = self.slots.size_of_group(group)
        return group * self.g + permute(off, size, subkeys(self.inner, group))


def chunk_size(n: int, strategy) -> int:
    """The group size in samples: ``strategy.chunk``, or when 0 the largest power of two up
    to DEFAULT_CHUNK whose RL reaches ``strategy.rl_floor`` (:func:`feedline.plan.rl.chunk_for_rl`)."""
    g = strategy.chunk
    if not g:
        from .rl import chunk_for_rl

        g = (
            chunk_for_rl(max(n, 1), strategy.rl_floor, max_chunk=DEFAULT_CHUNK)
            if strategy.rl_floor > 0
            else DEFAULT_CHUNK
        )
    return max(1, min(g, max(n, 1)))


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


def _make(n: int, strategy, key, geo):
    g = chunk_size(n, strategy)
    if strategy.chunk_layout == "column" and geo is not None and geo.steps:
        return ColumnChunkStream(n, g, key, geo)
    return ChunkStream(n, g, key)


ASSIGNMENT = register(
    Assignment(
        name="chunk",
        make=lambda n, strategy, key: ChunkStream(n, chunk_size(n, strategy), key),
        layout=lambda strategy: "column" if strategy.chunk_layout == "column" else "rank",
        world_independent=lambda strategy: strategy.chunk_layout == "column",
        make_geo=_make,
    )
)
