# SPDX-License-Identifier: Apache-2.0
"""What a node window holds (``node`` source): where each rank's samples lie in it, the
bytes of its halves and plan tables, a window's plan packed into its table and back, and
the key naming a pass. Pure functions of the plan: every rank of a node computes the
same."""

from __future__ import annotations

import hashlib

import numpy as np

from ..pipeline.reader import DIRECT_BLOCK
from ..plan.layout import even_start


def window_layout(plan, ops, steps: range, rank: int, first_rank: int) -> dict:
    """Where *rank*'s samples of one read window lie, in (step, slot) order.

    *ops* are the window's read operations (one after the other in the buffer), *steps*
    the steps the window serves, and *first_rank* the first rank whose sub-batch the
    buffer holds (the node's first rank when readers aggregate, else *rank* itself).
    Returns ``ids``, ``src`` (byte offset in the buffer), ``size``, per-step ``bounds``
    and ``steps``.
    """
    bases = np.cumsum([0] + [o.buffer_bytes for o in ops])[:-1]
    step = np.concatenate([o.step for o in ops])
    slot = np.concatenate([o.slot for o in ops])
    src = np.concatenate([o.src + b for o, b in zip(ops, bases, strict=True)])
    size = np.concatenate([o.size for o in ops])
    ids = np.concatenate([o.ids for o in ops])
    # a rank's sub-batch is the slots [lo, hi) of the buffer's list at each step
    st = np.arange(steps.start, steps.stop, dtype=np.int64)
    step_len = plan._geo.step_len(st)
    ranks = plan.world.size

    lo = even_start(step_len, ranks, rank) - even_start(step_len, ranks, first_rank)
    hi = even_start(step_len, ranks, rank + 1) - even_start(step_len, ranks, first_rank)
    k = step - steps.start
    mine = (slot >= lo[k]) & (slot < hi[k])
    order = np.lexsort((slot[mine], step[mine]))
    return {
        "ids": ids[mine][order],
        "src": src[mine][order],
        "size": size[mine][order],
        "bounds": np.searchsorted(step[mine][order], np.arange(steps.start, steps.stop + 1)),
        "steps": steps,
    }


def _window_bytes(plan, rpn: int, readers: int) -> tuple[int, int]:
    """Bytes of one half of the node window and of one plan table (pure in the plan).

    A table holds the plan of one window (``_pack_ops``: 5 words per sample, 3 per
    extent, at most one extent per sample). A half holds a window's payload at worst
    (its samples the dataset's longest records: :func:`~feedline.plan.reads.window_top`)
    and, within the node's share of the memory cap, half as much again for holes read
    through (LMDB page headers, gaps merged across); ``window_ops`` merges exact
    neighbours only when holes would not fit.
    """
    from ..plan.reads import PLAN_BYTES_PER_SAMPLE, window_cap, window_steps, window_top

    unit = -(-plan.batch_size // plan.world.size) * rpn  # a node's samples per step, at most
    samples = window_steps(plan) * unit
    payload = window_top(plan)(samples)
    tab = 8 * (3 + _OP_HEAD * readers) + PLAN_BYTES_PER_SAMPLE * samples
    half = max(payload, min(window_cap(plan) - tab, payload * 3 // 2), 1)
    if plan.strategy.read == "odirect":  # both halves start on a block: reads land in place
        half = -(-half // DIRECT_BLOCK) * DIRECT_BLOCK
    return int(half), int(tab)


_OP_HEAD = 4  # words per reader in a packed plan: reader, extents, samples, align


def _pack_ops(ops: list, out: np.ndarray) -> int:
    """Pack a window's ReadOps into int64 words *out*; returns the words used (-1: too
    few words)."""
    need = sum(_OP_HEAD + 3 * len(o.lengths) + 5 * len(o.ids) for o in ops)
    if need > len(out):  # pragma: no cover - tables are sized for the worst window
        return -1
    at = 0
    for o in ops:
        e, m = len(o.lengths), len(o.ids)
        out[at : at + _OP_HEAD] = (o.reader, e, m, o.align)
        at += _OP_HEAD
        for a, k in (
            (o.file_ids, e),
            (o.offsets, e),
            (o.lengths, e),
            (o.ids, m),
            (o.step, m),
            (o.slot, m),
            (o.src, m),
            (o.size, m),
        ):
            out[at : at + k] = a
            at += k
    return at


def _unpack_ops(words: np.ndarray, r: int, steps: range) -> list:
    """The ReadOps packed by :func:`_pack_ops` (arrays copied out of the table)."""
    from ..plan.reads import ReadOp

    ops, at = [], 0
    while at < len(words):
        reader, e, m, align = (int(x) for x in words[at : at + _OP_HEAD])
        at += _OP_HEAD
        cols = []
        for k in (e, e, e, m, m, m, m, m):
            cols.append(words[at : at + k].copy())
            at += k
        fid, off, ln, ids, step, slot, src, size = cols
        ops.append(ReadOp(reader, r, steps, fid, off, ln, ids, step, slot, src, size, align))
    return ops


def _plan_key(plan, first_step: int) -> int:
    """A 62-bit digest of what a pass delivers (equal on every rank of a node)."""
    h = hashlib.blake2b(digest_size=8)
    st = plan.strategy
    ident = (
        getattr(plan, "epoch", None),
        getattr(plan, "seed", None),
        first_step,
        plan.num_steps,
        plan.batch_size,
        plan.world.size,
        sorted(st.to_dict().items()) if hasattr(st, "to_dict") else repr(st),
    )
    h.update(repr(ident).encode())
    return int.from_bytes(h.digest(), "little") >> 2
