# SPDX-License-Identifier: Apache-2.0
"""I/O statistics of a plan without doing I/O (``feedline plan``).

For a few sampled units (nodes when aggregating, ranks otherwise) the reads of all
windows are computed at once with numpy — the same extents as
:func:`feedline.plan.reads.window_ops`, vectorised — and summarised per reader: bytes,
operations, largest and smallest read, bytes read for nothing. Seeking presets add the
cursor walks of the LMDB tree (:mod:`feedline.plan.lmdb_model`); mmap presets count
reactive 4 KiB page faults as operations. Units of a plan over uniform records are
statistically alike, so a handful of sampled units gives the per-reader figures of a
9,216-rank job in well under a second.
"""

from __future__ import annotations

import contextlib
from typing import Any, TypedDict

import numpy as np

from .extents import merge_extents
from .reads import _unit_positions, window_cap, window_steps, windows
from .rl import randomization_level

MMAP_PAGE = 4096
#: units with more samples than this use the closed form of ``window`` plans, or
#: sampled windows (:data:`SAMPLED_WINDOWS`) for the other assignments
EXACT_UNIT_SAMPLES = 1 << 18
#: windows of a unit looked at when it has more (evenly spread; figures scaled)
SAMPLED_WINDOWS = 64
#: records looked at at each end of a tile piece for its byte range (LMDB fills a leaf
#: from the end of the page, so offsets decrease inside a leaf of up to ~230 records)
EDGE_RECORDS = 512


class UnitExtents(TypedDict):
    """A unit's extents (:func:`unit_extents`)."""

    key: np.ndarray  # window * k + reader index, per extent
    length: np.ndarray  # bytes, per extent
    payload: np.ndarray  # bytes of the samples, per key
    k: int  # readers of the unit
    scale: float  # windows per window looked at (1: every window)


def unit_extents(plan, unit: int) -> UnitExtents:
    """All extents of a unit for the whole plan, vectorised.

    Returns arrays ``window``, ``part`` (reader index in the unit), ``length`` per extent
    and ``payload`` per (window, part) key, in the order of :func:`window_ops`, and
    ``scale``: 1, or — when the unit has more than :data:`SAMPLED_WINDOWS` windows and
    more than :data:`EXACT_UNIT_SAMPLES` samples — the steps per sampled step, the
    extents being those of :data:`SAMPLED_WINDOWS` windows spread evenly over the epoch
    (windows of a unit are alike: the cost stays bounded at any number of samples).
    """
    s = plan.strategy
    if plan.num_steps <= plan.first_step:
        z = np.zeros(0, dtype=np.int64)
        return {"key": z, "length": z, "payload": z, "k": 1, "scale": 1.0}
    if (
        s.assignment == "window"
        and hasattr(plan._stream, "pieces")
        and plan.first_step == 0
        and (not s.aggregated or len(plan.readers_of(plan.world.node_of(unit))) == 1)
        and plan.n // max(len(plan._stream.starts) - 1, 1) > EXACT_UNIT_SAMPLES
    ):
        return _window_unit_extents(plan, unit)
    w = window_steps(plan)
    nsteps = plan.num_steps - plan.first_step
    wins = windows(plan)
    per_unit = plan.n // max(plan.world.nodes if s.aggregated else plan.world.size, 1)
    if len(wins) > SAMPLED_WINDOWS and per_unit > EXACT_UNIT_SAMPLES:
        picked = np.linspace(0, len(wins) - 1, SAMPLED_WINDOWS).round().astype(np.int64)
        parts, seen = [], 0
        for j in np.unique(picked).tolist():
            steps = wins[j]
            parts.append(_unit_extents(plan, unit, steps, w))
            seen += len(steps)
        return _concat(parts, nsteps / seen)  # by steps: the last window may be short
    return _unit_extents(plan, unit, range(plan.first_step, plan.num_steps), w)


def _concat(parts: list[UnitExtents], scale: float) -> UnitExtents:
    """The sampled windows' extents as one unit's, keys renumbered window after window."""
    keys, lengths, payloads, off = [], [], [], 0
    k = parts[0]["k"] if parts else 1
    for ex in parts:
        # one window each: its keys are its readers 0..k-1 (payload padded to k keys)
        pay = np.zeros(max(-(-len(ex["payload"]) // k), 1) * k, dtype=np.int64)
        pay[: len(ex["payload"])] = ex["payload"]
        keys.append(ex["key"] + off)
        lengths.append(ex["length"])
        payloads.append(pay)
        off += len(pay)
    z = np.zeros(0, dtype=np.int64)
    return {
        "key": np.concatenate(keys) if keys else z,
        "length": np.concatenate(lengths) if lengths else z,
        "payload": np.concatenate(payloads) if payloads else z,
        "k": k,
        "scale": scale,
    }


def _unit_extents(plan, unit: int, steps: range, w: int) -> UnitExtents:
    """:func:`unit_extents` over *steps* (whole windows of *w* steps from ``steps.start``)."""
    s = plan.strategy
    pos, step, _ = _unit_positions(plan, unit, steps)
    ids = plan.ids_at(pos)
    fid, off, ln = plan.records.extents(ids)
    bounds = getattr(plan._stream, "bounds", None) if s.assignment == "window" else None
    if bounds is not None:  # the window shuffle's windows (the first w steps cut finer)
        window = np.searchsorted(bounds, step, side="right") - 1
        window -= int(window.min()) if len(window) else 0
    else:
        window = (step - steps.start) // w
    order = np.lexsort((off, fid, window))
    window, fid, off, ln = window[order], fid[order], off[order], ln[order]
    if s.aggregated:
        k = len(plan.readers_of(plan.world.node_of(plan.world.ranks_of(unit).start)))
    else:
        k = 1
    m = len(ln)
    csum = np.cumsum(ln)
    wstart = np.ones(m, dtype=bool)
    wstart[1:] = window[1:] != window[:-1]
    heads = np.flatnonzero(wstart)
    base = np.repeat(np.concatenate([[0], csum])[heads], np.diff(np.append(heads, m)))
    wtot = np.repeat(np.add.reduceat(ln, heads) if m else ln, np.diff(np.append(heads, m)))
    if k > 1:
        mid = (csum - base) - ln / 2.0
        part = np.minimum((mid * k // np.maximum(wtot, 1)).astype(np.int64), k - 1)
    else:
        part = np.zeros(m, dtype=np.int64)
    key = window * k + part
    gap = 0 if s.sample_reads else s.coalesce_gap

    new_key = np.ones(m, dtype=bool)
    new_key[1:] = key[1:] != key[:-1]

    def merge(gaps):
        """Extents of every (window, reader) key: the merge of window_ops, all at once."""
        if s.sample_reads:  # one read per sample
            return key, ln
        first, end, _ = merge_extents(fid, off, ln, gaps, cut=new_key)
        return key[first], end - off[first]

    if m == 0:
        z = np.zeros(0, dtype=np.int64)
        return {"key": z, "length": z, "payload": z, "k": k, "scale": 1.0}
    gaps = np.full(m, gap, dtype=np.int64)
    e_key, e_len = merge(gaps)
    if gap:
        nkeys = int(key.max()) + 1
        payload = np.bincount(key, weights=ln, minlength=nkeys)
        nbytes = np.bincount(e_key, weights=e_len, minlength=nkeys)
        wpay = np.bincount(key // k, weights=ln, minlength=nkeys // k + 1)
        room = np.maximum(window_cap(plan) - wpay, 0) // k
        bad = nbytes > payload + room[np.arange(nkeys) // k]
        if bad.any():
            gaps = np.where(bad[key], 0, gap)
            e_key, e_len = merge(gaps)
    payload = np.bincount(key, weights=ln, minlength=int(key.max()) + 1).astype(np.int64)
    return {"key": e_key, "length": e_len, "payload": payload, "k": k, "scale": 1.0}


def _payload(records, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Bytes of records ``[lo, hi)`` for each range (prefix sums of the lengths)."""
    size = getattr(records, "size", None)
    if isinstance(size, int):  # uniform records (FlatRecords, LmdbModel)
        return (hi - lo) * size
    csum = getattr(records, "_len_csum", None)
    if csum is None:
        lengths = getattr(records, "lengths", None)
        if lengths is None:
            _, _, lengths = records.extents(np.arange(records.n, dtype=np.int64))
        csum = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))])
        with contextlib.suppress(AttributeError, TypeError):  # frozen records: recomputed
            records._len_csum = csum
    return csum[hi] - csum[lo]


def _piece_ranges(records, lo: np.ndarray, hi: np.ndarray):
    """(first file, lowest offset, highest end, last file) of each record range, from
    the ``EDGE_RECORDS`` records at each end of the range."""
    cnt = np.minimum(hi - lo, EDGE_RECORDS)
    head = np.repeat(lo, cnt) + (np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt))
    tail = np.repeat(hi - cnt, cnt) + (
        np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    )
    starts = np.cumsum(cnt) - cnt
    hf, ho, _ = records.extents(head)
    tf, to, tl = records.extents(tail)
    o = np.minimum.reduceat(ho, starts)
    e = np.maximum.reduceat(to + tl, starts)
    return hf[starts], o, e, tf[starts + cnt - 1]


def _window_unit_extents(plan, unit: int) -> UnitExtents:
    """:func:`unit_extents` of a ``window`` plan in closed form: a unit's window is a run
    of the tile sequence, so its reads are the tile pieces it covers, merged — O(tiles)
    instead of O(samples). Holes inside a tile (page headers) are read through, as the
    coalescing of :func:`~feedline.plan.reads.window_ops` does."""
    st = plan._stream
    gap = plan.strategy.coalesce_gap
    u = plan.world.node_of(unit) if plan.strategy.aggregated else unit
    starts, lens = st.windows_of(u)
    keys, lengths, payload = [], [], []
    for i, (a, m) in enumerate(zip(starts.tolist(), lens.tolist(), strict=True)):
        lo, hi = st.pieces(a, a + m)
        f0, o0, end, f1 = _piece_ranges(plan.records, lo, hi)
        order = np.lexsort((o0, f0))
        f0, o0, end, f1 = f0[order], o0[order], end[order], f1[order]
        # a piece spanning two files is read as two extents: count it by its first file
        run_end = np.maximum.accumulate(end)
        new = np.ones(len(o0), dtype=bool)
        new[1:] = (f0[1:] != f0[:-1]) | (o0[1:] > run_end[:-1] + gap)
        heads = np.flatnonzero(new)
        tails = np.append(heads[1:], len(o0)) - 1
        ext = run_end[tails] - o0[heads]
        extra = int((f1 != f0).sum())
        keys.append(np.full(len(ext) + extra, i, dtype=np.int64))
        lengths.append(np.concatenate([ext, np.zeros(extra, dtype=np.int64)]))
        payload.append(int(_payload(plan.records, lo, hi).sum()))
    z = np.zeros(0, dtype=np.int64)
    return {
        "key": np.concatenate(keys) if keys else z,
        "length": np.concatenate(lengths) if lengths else z,
        "payload": np.asarray(payload, dtype=np.int64),
        "k": 1,
        "scale": 1.0,
    }


def _sample_units(count: int, want: int = 4) -> list[int]:
    if count <= want:
        return list(range(count))
    return sorted({0, count - 1, count // 2, *np.linspace(0, count - 1, want).astype(int).tolist()})


def walk_model(records) -> tuple[int, int]:
    """(bytes a cursor reads passing over every record, page size); (0, 4096) without a tree."""
    walk = getattr(records, "walk_bytes", None)
    if walk is not None:
        return int(walk), int(getattr(records, "page", MMAP_PAGE))
    meta = getattr(records, "meta", None) or {}
    if "leaf_pages" in meta and "page_size" in meta:
        return int(meta["leaf_pages"]) * int(meta["page_size"]), int(meta["page_size"])
    return 0, MMAP_PAGE


def seek_bytes_total(plan, payload_total: float) -> int:
    """Bytes all readers read to *locate* records at run time (0 when seek-free).

    ``seek`` walks LMDB cursors over the leaf pages: under ``strided``/``skip`` every
    reader's cursor passes over every step (the whole tree per epoch and reader: R x B
    records walked per step); under ``contiguous`` rank r walks from the start to its own
    region once; with ``pread`` and aggregation (LMDBIO-DIO, §4.3) one process walks the
    tree once for everybody. ``speculative`` (DM, §4.2) is charged the paper's bound of
    reading up to twice the needed data.
    """
    s = plan.strategy
    walk_all, _ = walk_model(plan.records)
    R = len(plan.readers)
    if s.locate == "speculative":
        return int(payload_total)
    if s.locate != "seek" or not walk_all:
        return 0
    if s.assignment == "contiguous":
        if s.region == "node" and s.aggregated:
            starts = [plan.world.ranks_of(m).start for m in range(plan.world.nodes)]
            return int(sum(walk_all * a // plan.world.size for a in starts) * R // plan.world.nodes)
        return int(walk_all * (plan.world.size - 1) // 2)
    if s.read != "mmap" and s.aggregated:
        return int(walk_all)
    return int(walk_all) * R


def store_load(plan, rank: int) -> tuple[np.ndarray, int]:
    """The DeepIO store's reads of *rank* in *plan*'s epoch (``sources/store.py``): its
    share of every round — the k-th of P equal runs of the round's sorted ids — merged
    across holes of at most the store's gap. Returns (lengths of the merged extents,
    payload bytes). R = 1 is one round of every id (loaded in the first epoch only), or
    the first epoch's K rounds when it loads progressively (``load_rounds``)."""
    from .assign_memory import layout_stream
    from .layout import floor_start
    from .store_cost import STORE_GAP

    P, n = plan.world.size, plan.n
    gap = int(plan.strategy.coalesce_gap) or STORE_GAP
    stream = plan._stream
    lay = layout_stream(n, plan.strategy, plan.seed, plan.batch_size)
    if lay is not None:  # R = 1 loaded progressively: the first epoch's rounds
        rounds = [lay.round_ids(r) for r in range(lay.rounds)]
    elif plan.strategy.memory_fraction < 1.0 and hasattr(stream, "round_bounds"):
        r = np.arange(stream.rounds, dtype=np.int64)
        lo, hi = stream.round_bounds(r)
        rounds = [
            np.sort(plan.ids_at(np.arange(a, b)))
            for a, b in zip(lo.tolist(), hi.tolist(), strict=True)
        ]
    else:
        rounds = [np.arange(n, dtype=np.int64)]
    lengths, payload = [], 0
    for ids in rounds:
        mine = ids[floor_start(len(ids), P, rank) : floor_start(len(ids), P, rank + 1)]
        if len(mine) == 0:
            continue
        fid, off, ln = (np.asarray(a, dtype=np.int64) for a in plan.records.extents(mine))
        o = np.lexsort((off, fid))
        first, end, _ = merge_extents(fid[o], off[o], ln[o], gap)
        lengths.append(end - off[o][first])
        payload += int(ln.sum())
    z = np.zeros(0, dtype=np.int64)
    return (np.concatenate(lengths) if lengths else z), payload


def _store_stats(plan, name: str, units: int) -> dict[str, Any]:
    """:func:`plan_stats` of a DeepIO store plan: every rank loads its shares (its first
    epoch; with R = 1 the later ones read nothing)."""
    P = plan.world.size
    rows = []
    for k in _sample_units(P, units):
        ln, payload = store_load(plan, k)
        rows.append(
            (
                int(ln.sum()),
                len(ln),
                int(ln.max()) if len(ln) else 0,
                int(ln.min()) if len(ln) else 0,
                payload,
            )
        )
    a = np.array(rows, dtype=np.float64)
    return {
        "preset": name,
        "ranks": P,
        "nodes": plan.world.nodes,
        "batch": plan.batch_size,
        "samples": plan.n,
        "steps": plan.num_steps,
        "readers": P,
        "concurrent_readers": P,
        "sampled_readers": len(rows),
        "steps_per_read": plan.num_steps,
        "bytes_per_reader": float(a[:, 0].mean()),
        "ops_per_reader": float(a[:, 1].mean()),
        "largest_read": int(a[:, 2].max()),
        "smallest_read": int(a[:, 3][a[:, 1] > 0].min()) if (a[:, 1] > 0).any() else 0,
        "seek_bytes_total": 0,
        "redundant_bytes_per_reader": float((a[:, 0] - a[:, 4]).mean()),
        "redundant_bytes_total": float((a[:, 0] - a[:, 4]).mean() * P),
        "payload_bytes_total": float(a[:, 4].mean() * P),
        "memory_cap": plan.memory_cap,
        "rl": randomization_level(plan),
        "strategy": plan.strategy.to_dict(),
        "store_load": True,
    }


def plan_stats(plan, name: str = "", *, units: int = 4) -> dict[str, Any]:
    """Per-reader I/O figures of *plan* (sampled units; see the module docstring). A
    DeepIO store plan (``store`` ordered or opportunistic) gives its loads instead
    (:func:`store_load`)."""
    s = plan.strategy
    if s.store in ("ordered", "opportunistic") and s.assignment == "memory":
        return _store_stats(plan, name, units)
    P, M = plan.world.size, plan.world.nodes
    n_units = M if s.aggregated else P
    readers = plan.readers
    R = len(readers)
    per_reader: list[dict[str, float]] = []
    _, page = walk_model(plan.records)
    for u in _sample_units(n_units, units):
        ex = unit_extents(plan, u)
        k = ex["k"]
        rk = ex["key"] % k if len(ex["key"]) else ex["key"]
        pk = np.arange(len(ex["payload"])) % k
        scale = float(ex["scale"])  # sampled windows stand for the unit's others
        for i in range(k):
            lens = ex["length"][rk == i]
            nbytes = round(int(lens.sum()) * scale)
            payload = round(int(ex["payload"][pk == i].sum()) * scale)
            ops = round(len(lens) * scale)
            largest = int(lens.max()) if ops else 0
            smallest = int(lens.min()) if ops else 0
            if s.read == "mmap":  # reactive 4 KiB page faults
                ops = -(-nbytes // page)
                largest = smallest = min(page, nbytes) if nbytes else 0
            per_reader.append(
                {
                    "bytes": nbytes,
                    "ops": ops,
                    "largest": largest,
                    "smallest": smallest,
                    "redundant": nbytes - payload,
                    "payload": payload,
                }
            )
    arr = {k: np.array([r[k] for r in per_reader], dtype=np.float64) for k in per_reader[0]}
    seek = seek_bytes_total(plan, float(arr["payload"].mean()) * R)
    seek_ops = -(-seek // page) if s.read == "mmap" else (seek // page if seek else 0)
    conc = s.stagger if 0 < s.stagger < R else R
    nwin = max(plan.num_steps - plan.first_step, 0)
    w = window_steps(plan) if nwin else 0
    out = {
        "preset": name,
        "ranks": P,
        "nodes": M,
        "batch": plan.batch_size,
        "samples": plan.n,
        "steps": plan.num_steps,
        "readers": R,
        "concurrent_readers": conc,
        "sampled_readers": len(per_reader),
        "steps_per_read": w,
        "bytes_per_reader": float(arr["bytes"].mean()) + seek / R,
        "ops_per_reader": float(arr["ops"].mean()) + seek_ops / R,
        "largest_read": int(arr["largest"].max()),
        "smallest_read": int(arr["smallest"][arr["ops"] > 0].min())
        if (arr["ops"] > 0).any()
        else 0,
        "seek_bytes_total": seek,
        "redundant_bytes_per_reader": float(arr["redundant"].mean()) + seek / R,
        "redundant_bytes_total": float(arr["redundant"].mean() * R) + seek,
        "payload_bytes_total": float(arr["payload"].mean() * R),
        "memory_cap": plan.memory_cap,
        "rl": randomization_level(plan),
        "strategy": s.to_dict(),
    }
    return out
