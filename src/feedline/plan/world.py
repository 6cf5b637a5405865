# SPDX-License-Identifier: Apache-2.0
"""WorldSpec: the shape of a job (ranks, nodes, readers) as pure data.

The planner sees only this; ``feedline.dist.World`` builds one from MPI. Emulated nodes
follow docs/planner.md ("Epoch and step"): P ranks split into M nodes of contiguous ranks, node = rank * M // P.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .layout import ceil_start, floor_start


@dataclass(frozen=True, slots=True)
class WorldSpec:
    """Ranks, nodes and readers of a job.

    Parameters
    ----------
    size : int
        Number of ranks P.
    nodes : int
        Number of nodes M (1 <= M <= P).
    readers_per_node : int
        k reader ranks per node (aggregation); 0 means every rank reads for itself.
    """

    size: int
    nodes: int = 1
    readers_per_node: int = 0

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ConfigError(f"world size must be >= 1, got {self.size}")
        if not 1 <= self.nodes <= self.size:
            raise ConfigError(f"nodes must be in [1, {self.size}] (ranks), got {self.nodes}")
        if self.readers_per_node < 0:
            raise ConfigError("readers_per_node must be >= 0")

    def node_of(self, rank: int) -> int:
        """Node of *rank*: rank * M // P."""
        return rank * self.nodes // self.size

    def ranks_of(self, node: int) -> range:
        """Ranks of *node*, contiguous."""
        # the ranks r with r*M//P == node: from ceil(node*P/M)
        return range(
            ceil_start(self.size, self.nodes, node), ceil_start(self.size, self.nodes, node + 1)
        )

    def readers_of(self, node: int) -> list[int]:
        """Reader ranks of *node*: k ranks spread evenly over the node (all if k == 0)."""
        ranks = self.ranks_of(node)
        k = self.readers_per_node
        if k == 0 or k >= len(ranks):
            return list(ranks)
        return [ranks[floor_start(len(ranks), k, i)] for i in range(k)]

    @property
    def readers(self) -> list[int]:
        """All reader ranks, node by node."""
        return [r for n in range(self.nodes) for r in self.readers_of(n)]
