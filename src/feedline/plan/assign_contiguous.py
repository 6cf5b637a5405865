# SPDX-License-Identifier: Apache-2.0
"""``contiguous``: MPI-Caffe's improved pattern. Rank r owns one contiguous region of the
records, sized to exactly what it consumes in the epoch, and reads it front to back, so
read-ahead and client caches work. With ``region="node"`` each node owns one region that
its ranks consume step by step, so the node's future steps are one contiguous run (the
reads LMDBIO's coalescing makes). Depends on P (and M) by definition."""

from __future__ import annotations

from .stream import Assignment, Identity

ASSIGNMENT = Assignment(
    name="contiguous",
    make=lambda n, strategy, key: Identity(n),
    layout=lambda strategy: "node" if strategy.region == "node" else "rank",
    world_independent=lambda strategy: False,
)
