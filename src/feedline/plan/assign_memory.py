"""``memory(R)``: DeepIO's hybrid backend-memory order (§III-B/C). The dataset is cut
into units of g contiguous samples (its "files"); each round loads a random selection of
R·(units) into the job's memory, drawn without replacement, and the samples in memory are
permuted completely. R = 1 is one full permutation. The lower R, the less random
(DeepIO's RL), but only a fraction R of the dataset must fit in memory."""

from __future__ import annotations

import numpy as np

from ._perm import derive_key, permute, subkeys
from .streams import Assignment, GroupSlots, register

DEFAULT_UNIT = 64


class MemoryStream:
    def __init__(self, n: int, g: int, fraction: float, key: np.uint64) -> None:
        self.n, self.g = n, g
        self.slots = GroupSlots(n, g, key)
        units = self.slots.groups
        self.per_round = max(1, round(fraction * units)) if units else 1
        self.rounds = -(-units // self.per_round) if units else 0
        self.inner = derive_key(int(key), 0x4D454D52)  # "MEMR"

    def round_bounds(self, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """First and one-past-last position of rounds *r*."""
        r = np.asarray(r, dtype=np.int64)
        lo_slot = r * self.per_round
        hi_slot = np.minimum(lo_slot + self.per_round, self.slots.groups)
        lo = self.slots.slot_start(lo_slot)
        hi = np.where(hi_slot >= self.slots.groups, self.n, self.slots.slot_start(hi_slot))
        return lo, hi

    def take(self, q: np.ndarray) -> np.ndarray:
        q = np.asarray(q, dtype=np.int64)
        # round of q: slot of q // per_round
        slot, _, _ = self.slots.locate(q)
        r = slot // self.per_round
        lo, hi = self.round_bounds(r)
        inner = permute(q - lo, hi - lo, subkeys(self.inner, r))
        _, group, off = self.slots.locate(lo + inner)
        return group * self.g + off


def unit_size(n: int, strategy) -> int:
    g = strategy.chunk or DEFAULT_UNIT
    return max(1, min(g, max(n, 1)))


ASSIGNMENT = register(
    Assignment(
        name="memory",
        make=lambda n, strategy, key: MemoryStream(
            n, unit_size(n, strategy), strategy.memory_fraction, key
        ),
        layout=lambda strategy: "row",
        world_independent=lambda strategy: True,
    )
)
