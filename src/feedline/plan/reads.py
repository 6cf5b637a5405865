# SPDX-License-Identifier: Apache-2.0
"""Read operations: which byte extents each reader reads, for which steps (LMDBIO §4.1, §4.5).

A *unit* is what one set of readers fills: a node's shared window when the strategy
aggregates (k readers per node), or a rank's private buffer. The steps of the epoch are
cut into *windows* of w consecutive steps, the same for every unit so that token rounds
line up: w = 1 without coalescing; with coalescing, the smallest w whose mean data per
reader reaches ``coalesce_bytes``, capped so that a window's worst-case span (holes
included) fits half the node's memory cap (one window consumed while the next is read).
A window's samples are sorted by location, split among the unit's k readers into
contiguous byte ranges, and merged into extents across holes of at most
``coalesce_gap`` bytes (also without coalescing; never with ``sample_reads``). The
async-I/O presets (chunk, rank layout) use windows of one group's worth of steps; the
chunk column layout uses windows of a multiple of g steps, so every read is whole groups. Each operation says which samples land in which step's buffer
slot and at which byte of the operation's buffer, and which steps it serves (the buffer's
lifetime).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ConfigError
from ..units import format_bytes
from .extents import merge_extents
from .layout import even_start

if TYPE_CHECKING:
    from .plan import Plan

LIVE_WINDOWS = 2  # double buffering: one window consumed while the next is read
#: bytes per sample of a window's plan that node sources keep beside its data (the node
#: source publishes each window's plan in shared memory: 5 words per sample, 3 per extent)
PLAN_BYTES_PER_SAMPLE = 64


@dataclass(frozen=True, slots=True)
class ReadOp:
    """One read operation of a reader: coalesced extents and where their samples go.

    Attributes
    ----------
    reader : int
        Reader rank.
    round : int
        Window index (token round when staggering).
    steps : range
        Steps whose samples this operation carries; its buffer may be released after the
        last of them is consumed.
    file_ids, offsets, lengths : numpy.ndarray of int64
        The extents to read, sorted by (file, offset); their bytes are concatenated in
        the operation's buffer.
    ids : numpy.ndarray of int64
        Sample ids carried (a sample appears once per delivery).
    step : numpy.ndarray of int64
        Step of each carried sample.
    slot : numpy.ndarray of int64
        Index of each sample in its step's unit list (``node_samples(node, step)`` when
        aggregated, ``samples(rank, step)`` otherwise).
    src : numpy.ndarray of int64
        Byte offset of each sample in the operation's buffer.
    size : numpy.ndarray of int64
        Byte length of each sample.
    align : int
        0: the extents lie back to back in the buffer; else each starts at a multiple
        of *align* bytes (``align_op``: direct reads land in place).
    """

    reader: int
    round: int
    steps: range
    file_ids: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    ids: np.ndarray
    step: np.ndarray
    slot: np.ndarray
    src: np.ndarray
    size: np.ndarray
    align: int = 0

    @property
    def nbytes(self) -> int:
        """Bytes read from storage (holes included)."""
        return int(self.lengths.sum())

    def _slots(self) -> np.ndarray:
        a = self.align
        return -(-self.lengths // a) * a if a else self.lengths

    @property
    def buffer_bytes(self) -> int:
        """Bytes of the operation's buffer: its extents back to back, or each at a
        multiple of ``align`` (then a multiple of ``align`` itself)."""
        return int(self._slots().sum())

    def placement(self) -> np.ndarray:
        """Where each extent lands in the operation's buffer."""
        slots = self._slots()
        out = np.zeros(len(slots), dtype=np.int64)
        if len(slots) > 1:
            np.cumsum(slots[:-1], out=out[1:])
        return out

    @property
    def payload(self) -> int:
        """Bytes of the carried samples."""
        return int(self.size.sum())

    @property
    def num_reads(self) -> int:
        """Number of extents (system calls before any engine splitting)."""
        return len(self.offsets)


def unit_of(plan: Plan, reader: int) -> tuple[int, list[int]]:
    """``(unit id, readers of the unit)`` of *reader*; units are nodes or ranks."""
    node = plan.world.node_of(reader)
    readers = plan.readers_of(node)
    if reader not in readers:
        raise ConfigError(f"rank {reader} is not a reader of node {node} (readers: {readers})")
    if plan.strategy.aggregated:
        return node, readers
    return reader, [reader]


def _unit_shape(plan: Plan) -> tuple[int, int, int, float]:
    """(worst samples per step of a unit, units per node, readers per unit, mean samples)."""
    P, B, M = plan.world.size, plan.batch_size, plan.world.nodes
    per_rank = -(-B // P)
    ranks_per_node = -(-P // M)  # nodes are contiguous runs of floor/ceil(P/M) ranks
    if plan.strategy.aggregated:
        k = max(len(plan.readers_of(n)) for n in {0, M - 1})
        return per_rank * ranks_per_node, 1, k, B / M
    return per_rank, ranks_per_node, 1, B / P


#: the LMDBIO presets' orders: their sources keep a slot of the longest record per sample
SLOTTED = ("strided", "contiguous", "skip")


def most_that_fit(fits, hi: int) -> int:
    """The largest w in ``[1, hi]`` with ``fits(w)`` (1 if none): *fits* holds up to
    some w and not beyond (a window's worst case grows with its steps)."""
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def window_top(plan: Plan):
    """``top(k)``: the most bytes *k* samples of a window take: the sum of the *k*
    longest records (:func:`~feedline.plan.records.top_bytes`), or *k* slots of the
    longest record for the LMDBIO presets' orders (:data:`SLOTTED`: their sources lay
    samples out that way)."""
    from .records import top_bytes

    rec = plan.records
    if plan.strategy.assignment in SLOTTED:
        return lambda k: int(k) * int(rec.max_length)
    return lambda k: top_bytes(rec, k)


def window_cap(plan: Plan) -> int:
    """Bytes one unit may hold for one window: the node cap over live windows and units."""
    _, units_per_node, _, _ = _unit_shape(plan)
    return plan.memory_cap // (LIVE_WINDOWS * units_per_node)


def window_steps(plan: Plan) -> int:
    """Steps per window w (same for every unit); raises when one step cannot fit."""
    s = plan.strategy
    w_fixed = getattr(plan._stream, "w", None)
    if s.assignment == "window" and w_fixed is not None:
        # the window shuffle's windows are the read windows (sized by the planner)
        return int(max(1, min(w_fixed, max(plan.num_steps, 1))))
    unit_samples, _, k, mean_unit = _unit_shape(plan)
    cap = window_cap(plan)
    meta = PLAN_BYTES_PER_SAMPLE if s.aggregated else 0
    top = window_top(plan)
    worst_step = top(unit_samples) + unit_samples * meta
    if worst_step > cap:
        raise ConfigError(
            f"memory cap {format_bytes(plan.memory_cap)} per node cannot hold two steps of reads "
            f"({format_bytes(worst_step)} per {'node' if s.aggregated else 'rank'} and step at worst): "
            "raise memory_cap or lower the batch size"
        )
    steps_max = max(plan.num_steps, 1)
    w_cap = most_that_fit(
        lambda w: top(w * unit_samples) + w * unit_samples * meta <= cap, steps_max
    )
    if s.assignment == "chunk":
        from .rl import chunk_size

        # the column layout's slot height (tiles of chunk_bytes may make it larger)
        g = int(getattr(plan._stream, "g", 0)) or chunk_size(plan.n, s)
        if s.chunk_layout == "rank" and not s.coalesce_bytes:
            # the async-I/O paper's I/O thread reads one whole group per read (§III)
            per_rank = max(1, plan.batch_size // plan.world.size)
            return int(max(1, min(w_cap, -(-g // per_rank), steps_max)))
        if s.chunk_layout == "column":
            # a column consumes one group per g steps: windows of whole groups
            w = (
                g
                if not s.coalesce_bytes or s.sample_reads
                else _coalesce_target(plan, k, mean_unit)
            )
            w = -(-w // g) * g
            if w > w_cap:
                w = w_cap // g * g or w_cap
            return int(max(1, min(w, steps_max)))
    if s.coalesce_bytes <= 0 or s.sample_reads:
        return 1
    return int(max(1, min(w_cap, _coalesce_target(plan, k, mean_unit), steps_max)))


def _coalesce_target(plan: Plan, k: int, mean_unit: float) -> int:
    """Steps whose mean data per reader reaches ``coalesce_bytes``."""
    mean_step = max(mean_unit * plan.records.mean_length, 1.0)
    return max(1, int(np.ceil(k * plan.strategy.coalesce_bytes / mean_step)))


def windows(plan: Plan) -> list[range]:
    """The step windows of the plan, from ``first_step``."""
    if plan.num_steps <= plan.first_step:
        return []
    w = window_steps(plan)
    first = plan.first_step
    if plan.strategy.assignment == "window" and hasattr(plan._stream, "bounds"):
        # the shuffle's windows (the first cut finer), also when resumed mid-window
        b = [int(x) for x in plan._stream.bounds if x < plan.num_steps] + [plan.num_steps]
        out = [range(max(a, first), z) for a, z in itertools.pairwise(b)]
        return [r for r in out if len(r)]
    return [range(a, min(a + w, plan.num_steps)) for a in range(first, plan.num_steps, w)]


def _unit_positions(
    plan: Plan, unit: int, steps: range
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Global positions of a unit over *steps*, with their step and slot."""
    geo = plan._geo
    if plan.strategy.aggregated:
        ranks = plan.world.ranks_of(unit)
        first, last = ranks.start, ranks.stop - 1
    else:
        first = last = unit
    st = np.arange(steps.start, steps.stop, dtype=np.int64)
    L = geo.step_len(st)
    P = plan.world.size
    lo = st * plan.batch_size + even_start(L, P, first)
    hi = st * plan.batch_size + even_start(L, P, last + 1)
    cnt = hi - lo
    starts = np.zeros(len(st) + 1, dtype=np.int64)
    np.cumsum(cnt, out=starts[1:])
    idx = np.arange(starts[-1], dtype=np.int64)
    step = np.repeat(st, cnt)
    slot = idx - np.repeat(starts[:-1], cnt)
    pos = np.repeat(lo, cnt) + slot
    return pos, step, slot


def _merge(fid, off, ln, gap: int, separate: bool):
    """Sorted extents merged across holes <= gap (:func:`~feedline.plan.extents.merge_extents`),
    or each its own read when *separate*; returns extents and each input's extent."""
    if separate:
        return fid.copy(), off.copy(), ln.copy(), np.arange(len(off), dtype=np.int64)
    first, end, which = merge_extents(fid, off, ln, gap)
    return fid[first], off[first], end - off[first], which


def window_ops(
    plan: Plan, unit: int, readers: list[int], r: int, steps: range, cap: int | None = None
) -> list[ReadOp]:
    """The read operations of every reader of *unit* for window *r*.

    Holes are read through only while the window stays under its memory share (*cap*
    bytes, default :func:`window_cap`): the payload always fits (``window_steps`` sized
    it), and a reader whose merged extents would exceed its share of the remaining room
    merges exact neighbours only.
    """
    s = plan.strategy
    pos, step, slot = _unit_positions(plan, unit, steps)
    ids = plan.ids_at(pos)
    fid, off, ln = plan.records.extents(ids)
    order = np.lexsort((off, fid))
    ids, step, slot, fid, off, ln = (a[order] for a in (ids, step, slot, fid, off, ln))
    k = len(readers)
    if k > 1 and len(ids):
        mid = np.cumsum(ln) - ln / 2.0
        part = np.minimum((mid * k // max(float(ln.sum()), 1.0)).astype(np.int64), k - 1)
    else:
        part = np.zeros(len(ids), dtype=np.int64)
    gap = 0 if s.sample_reads else s.coalesce_gap
    ops = []
    cuts = np.searchsorted(part, np.arange(k + 1))
    room = max((window_cap(plan) if cap is None else cap) - int(ln.sum()), 0) // k
    for i, reader in enumerate(readers):
        a, b = cuts[i], cuts[i + 1]
        e_fid, e_off, e_len, which = _merge(fid[a:b], off[a:b], ln[a:b], gap, s.sample_reads)
        if gap and int(e_len.sum()) > int(ln[a:b].sum()) + room:
            e_fid, e_off, e_len, which = _merge(fid[a:b], off[a:b], ln[a:b], 0, False)
        buf_start = np.zeros(len(e_len), dtype=np.int64)
        if len(e_len) > 1:
            np.cumsum(e_len[:-1], out=buf_start[1:])
        src = buf_start[which] + (off[a:b] - e_off[which]) if b > a else np.zeros(0, dtype=np.int64)
        ops.append(
            ReadOp(
                reader=reader,
                round=r,
                steps=steps,
                file_ids=e_fid,
                offsets=e_off,
                lengths=e_len,
                ids=ids[a:b],
                step=step[a:b],
                slot=slot[a:b],
                src=src,
                size=ln[a:b],
            )
        )
    return ops


def iter_reads(plan: Plan, reader: int) -> Iterator[ReadOp]:
    """Read operations of *reader*, one per window, in order (lazily)."""
    unit, readers = unit_of(plan, reader)
    i = readers.index(reader)
    for r, steps in enumerate(windows(plan)):
        yield window_ops(plan, unit, readers, r, steps)[i]


def reads_of(plan: Plan, reader: int) -> list[ReadOp]:
    """All read operations of *reader* (one per window; some may be empty)."""
    return list(iter_reads(plan, reader))


#: extents shorter than this many alignment blocks (on average) are left as they are:
#: widening them would cost more memory than the copy it saves
ALIGN_MIN_BLOCKS = 16
#: an operation is widened only while its buffer grows by at most this share (the
#: sources' memory estimates count it: ``align_slack``)
ALIGN_MAX_GROWTH = 1 / 16


def align_slack(nbytes: int, align: int) -> int:
    """Bytes a buffer of *nbytes* may grow by through :func:`align_op`, with the block of
    slack that aligns its start."""
    return int(nbytes * ALIGN_MAX_GROWTH) + 2 * align


def align_op(op: ReadOp, align: int, file_sizes) -> ReadOp:
    """*op* with every extent widened to whole blocks of *align* bytes (clamped at its
    file's end) and blocks shared by neighbours merged, so that a buffer aligned to
    *align* receives every extent at an aligned place: an ``O_DIRECT`` engine then reads
    straight into the buffer, where it otherwise reads each extent into a bounce buffer
    and copies it (one memcpy of every byte). Costs at most ``2 * align`` bytes of buffer
    and storage per extent; ops whose extents average fewer than ``ALIGN_MIN_BLOCKS``
    blocks, or whose buffer would grow by more than ``ALIGN_MAX_GROWTH``, are returned
    unchanged. Pure: ids, steps, slots and sizes are kept, ``src``
    points into the widened layout."""
    n = len(op.lengths)
    if align <= 1 or n == 0 or int(op.lengths.sum()) < ALIGN_MIN_BLOCKS * align * n:
        return op
    sizes = np.asarray(file_sizes, dtype=np.int64)
    fid, off, ln = op.file_ids, op.offsets, op.lengths
    start = np.zeros(n, dtype=np.int64)
    np.cumsum(ln[:-1], out=start[1:])
    # each sample's file offset, from its place in the old layout
    j = np.searchsorted(start, op.src, side="right") - 1
    s_off = off[j] + (op.src - start[j])
    lo = off // align * align
    hi = np.minimum(-(-(off + ln) // align) * align, np.maximum(sizes[fid], off + ln))
    # merge widened extents of one file that touch or overlap
    new = np.ones(n, dtype=bool)
    new[1:] = (fid[1:] != fid[:-1]) | (lo[1:] > hi[:-1])
    group = np.cumsum(new) - 1
    g_lo = lo[new]
    g_hi = np.maximum.reduceat(hi, np.flatnonzero(new))
    g_fid = fid[new]
    g_len = g_hi - g_lo
    # an extent that ends at its file's end, inside a block: its whole blocks, then the
    # tail on its own (the only bytes that still go through the bounce buffer)
    cut = g_hi // align * align
    split = (g_hi % align != 0) & (cut > g_lo)
    rep = np.where(split, 2, 1)
    first = np.cumsum(rep) - rep
    fid2, lo2, len2 = np.repeat(g_fid, rep), np.repeat(g_lo, rep), np.repeat(g_len, rep)
    at = first[split]
    len2[at] = cut[split] - g_lo[split]
    lo2[at + 1] = cut[split]
    len2[at + 1] = g_hi[split] - cut[split]
    out = replace(op, file_ids=fid2, offsets=lo2, lengths=len2, align=align)
    if out.buffer_bytes > op.nbytes * (1 + ALIGN_MAX_GROWTH):
        return op
    k = group[j]  # every piece at a multiple of the block in the buffer (a tail padded)
    return replace(out, src=out.placement()[first[k]] + (s_off - g_lo[k]))
