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


ASSIGNMENT = register(
    Assignment(
        name="chunk",
        make=lambda n, strategy, key: ChunkStream(n, chunk_size(n, strategy), key),
        layout=lambda strategy: "column" if strategy.chunk_layout == "column" else "rank",
        world_independent=lambda strategy: strategy.chunk_layout == "column",
    )
)
