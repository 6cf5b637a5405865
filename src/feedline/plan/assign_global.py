# SPDX-License-Identifier: Apache-2.0
"""``global``: a full keyed permutation of all samples each epoch (TF/DeepIO shuffling).

Most random (RL 100%), least local: every sample is a separate small read. Positions are
permuted one at a time (:mod:`feedline.plan._perm`), so a rank plans its share in
O(samples / ranks). World-size independent."""

from __future__ import annotations

import numpy as np

from ._perm import permute
from .stream import Assignment


class GlobalStream:
    def __init__(self, n: int, key: np.uint64) -> None:
        self.n, self.key = n, key

    def take(self, q: np.ndarray) -> np.ndarray:
        return permute(q, self.n, self.key)


ASSIGNMENT = Assignment(
    name="global",
    make=lambda n, strategy, key: GlobalStream(n, key),
    layout=lambda strategy: "row",
    world_independent=lambda strategy: True,
)
