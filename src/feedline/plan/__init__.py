# SPDX-License-Identifier: Apache-2.0
"""The pure planner: orders, sub-batches, read extents and staggering tokens.

No I/O and no MPI: ``make_plan(records, world, strategy, seed, epoch, batch_size)``
gives a :class:`Plan` that answers every rank's questions in O(samples / ranks).
See ``docs/planner.md``.
"""

from __future__ import annotations

from .layout import num_steps, sub_batch_bounds
from .plan import Plan, epoch_order, make_plan, rank_samples
from .reads import ReadOp
from .records import FlatRecords, IndexRecords, Records
from .stagger import StaggerInfo
from .strategy import PRESET_DOCS, PRESETS, Strategy, get_strategy
from .world import WorldSpec

__all__ = [
    "PRESETS",
    "PRESET_DOCS",
    "FlatRecords",
    "IndexRecords",
    "Plan",
    "ReadOp",
    "Records",
    "StaggerInfo",
    "Strategy",
    "WorldSpec",
    "epoch_order",
    "get_strategy",
    "make_plan",
    "num_steps",
    "rank_samples",
    "sub_batch_bounds",
]
