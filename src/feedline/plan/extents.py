# SPDX-License-Identifier: Apache-2.0
"""Extent merging: byte extents sorted by file and offset, joined across small holes.

One implementation for the planner's reads (:func:`feedline.plan.reads.window_ops`),
the plan statistics (:func:`feedline.plan.stats.unit_extents`, all windows and readers
of a unit at once) and the reader's :func:`~feedline.pipeline.reader.coalesce`.
"""

from __future__ import annotations

import numpy as np


def merge_extents(
    fid: np.ndarray,
    off: np.ndarray,
    ln: np.ndarray,
    gap: int | np.ndarray,
    *,
    cut: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge extents ``(fid, off, ln)`` (int64, sorted by file, then offset) across holes
    of at most *gap* bytes; overlapping and duplicated extents join one merged extent.

    *gap* is one number, or an int64 array: the hole allowed before each extent. *cut*
    (bool per extent) starts a new group where True: extents of two groups never merge
    (each group must be sorted by file and offset).

    Returns ``(first, end, which)``: the index of each merged extent's first input extent
    (its file is ``fid[first]``, its offset ``off[first]``), each merged extent's end
    (exclusive), and the merged extent of each input extent.
    """
    m = len(off)
    if m == 0:
        z = np.zeros(0, dtype=np.int64)
        return z, z, z
    end = off + ln
    group = np.ones(m, dtype=bool)
    group[1:] = fid[1:] != fid[:-1]
    if cut is not None:
        group |= cut
    # running max of the ends, restarted at each group: lifting group g by g·scale (more
    # than any end) lets one cumulative max serve every group
    seg = np.cumsum(group)
    scale = int(end.max()) + 1
    if int(seg[-1]) * scale >= 2**62:  # int64 would overflow: exact Python integers
        lift = seg.astype(object) * scale
        run_end = np.asarray(np.maximum.accumulate(lift + end) - lift, dtype=np.int64)
    else:
        lift = seg * scale
        run_end = np.maximum.accumulate(lift + end) - lift
    new = group.copy()
    if isinstance(gap, np.ndarray):
        new[1:] |= off[1:] > run_end[:-1] + gap[1:]
    else:  # a hole wider than any end changes nothing (and must not overflow)
        new[1:] |= off[1:] > run_end[:-1] + min(int(gap), scale)
    which = np.cumsum(new) - 1
    first = np.flatnonzero(new)
    last = np.append(first[1:], m) - 1
    return first, run_end[last], which
