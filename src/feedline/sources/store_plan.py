# SPDX-License-Identifier: Apache-2.0
"""The DeepIO store's layout, from the plan alone (every rank computes the same, without
communicating): the rounds and what each step needs, each rank's share of a round, the
reads of a share (through small holes) and the bytes of a slot (docs/loader.md, "The
DeepIO store"); and whether the store can be the ``feedline`` preset's choice here."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..plan.extents import merge_extents
from ..plan.layout import floor_start
from ..plan.store_cost import STORE_GAP

#: a share of a round (R < 1) is read through its holes if it fits its slot sized
#: this much over the dataset's own proportion of holes; else record by record (gap 0)
_HOLE_MARGIN = 1.02
#: a progressive store's slot holds its round's largest share for the Loader's seed and
#: this much more: another seed's (a state loaded) needs a larger store only when the
#: dataset's short last unit moves to a round that had none, or its shares differ more
_SEED_MARGIN = 1.02


class _Rounds:
    """The rounds of one plan, in positions of the epoch order, and what each step needs.

    A progressive store (``load_rounds``, R = 1) holds epoch 0's ``memory(1/K)`` rounds
    (:func:`~feedline.plan.assign_memory.layout_stream`), one slot each, kept for the
    later epochs: epoch 0's steps need the rounds their positions lie in; any other
    pass (a later epoch, or an order rebased for another world) needs them all at its
    first step.
    """

    def __init__(self, plan) -> None:
        from ..plan.assign_memory import layout_stream

        stream = plan._stream
        self.total = plan.total
        lay = layout_stream(plan.n, plan.strategy, plan.seed, plan.batch_size)
        self.progressive = lay is not None
        own = True  # the steps' positions are those of the rounds
        if lay is not None:
            self.stream = lay
            # epoch 0's order is the layout's rounds exactly: same unit, same cuts (a
            # count alone can agree while the rounds differ)
            own = (
                plan.epoch == 0
                and hasattr(stream, "round_bounds")
                and getattr(stream, "g", None) == lay.g
                and np.array_equal(getattr(stream, "cuts", ()), lay.cuts)
            )
            lo, hi = lay.round_bounds(np.arange(lay.rounds, dtype=np.int64))
            self.lo = np.asarray(lo, dtype=np.int64)
            self.hi = np.asarray(hi, dtype=np.int64)
        elif hasattr(stream, "round_bounds") and plan._layout == "row" and stream.rounds > 1:
            self.stream = stream
            r = np.arange(stream.rounds, dtype=np.int64)
            lo, hi = stream.round_bounds(r)
            self.lo = np.asarray(lo, dtype=np.int64)
            self.hi = np.asarray(hi, dtype=np.int64)
        else:  # one round: the whole epoch (R = 1, or an order without rounds)
            self.stream = stream
            self.lo = np.array([0], dtype=np.int64)
            self.hi = np.array([max(plan.n, 1)], dtype=np.int64)
        self.count = len(self.lo)
        self.whole = self.count == 1
        B = plan.batch_size
        steps = np.arange(plan.num_steps, dtype=np.int64)
        first = steps * B
        last = np.minimum(first + B, plan.total) - 1
        last = np.maximum(last, first)
        wraps = last >= plan.n  # circular: steps that wrap to the start of the order
        if plan.total > plan.n:  # circular: the last step wraps to the start of the order
            if not (self.whole or self.progressive):
                raise ConfigError(
                    "the DeepIO store cannot wrap the last step to the first round "
                    "(circular=True) when memory_fraction < 1: its slot holds another "
                    "round by then; use memory_fraction=1, drop_last=True or circular=False"
                )
            # the wrapped positions are the order's first: round 0, kept by then
            first, last = np.minimum(first, plan.n - 1), np.minimum(last, plan.n - 1)
        if own:
            self.step_min = np.searchsorted(self.hi, first, side="right")
            self.step_max = np.searchsorted(self.hi, last, side="right")
            if self.progressive:  # a wrapped step also needs round 0 (a resume there)
                self.step_min[wraps] = 0
        else:  # a progressive store's other passes: every round at the first step
            self.step_min = np.zeros(len(steps), dtype=np.int64)
            self.step_max = np.full(len(steps), self.count - 1, dtype=np.int64)
        span = int((self.step_max - self.step_min).max()) + 1 if len(steps) else 1
        self.last = int(self.step_max.max()) if len(steps) else -1  # last round needed
        if self.progressive:
            self.slots = self.count  # every round kept: R = 1 in the end
        else:
            self.slots = 1 if self.whole else max(2, span)
        self._cache: dict[int, np.ndarray] = {}
        self._plan = plan

    def ids(self, r: int) -> np.ndarray:
        """The round's sample ids, sorted (its positions are ``[lo, hi)``): the units
        (groups of g contiguous samples) of its slots, so one permutation per unit, not
        per sample."""
        if self.whole:
            return np.arange(self._plan.n, dtype=np.int64)
        cached = self._cache.get(r)
        if cached is not None:
            return cached
        ids = self.stream.round_ids(r)
        self._cache = {r: ids}  # the last round asked for (begin, then complete)
        return ids


def _share(ids: np.ndarray, P: int, k: int) -> np.ndarray:
    """Rank *k*'s share of a round's sorted ids: P runs of equal-as-possible count."""
    n = len(ids)
    return ids[floor_start(n, P, k) : floor_start(n, P, k + 1)]


def share_bytes(
    fid: np.ndarray, off: np.ndarray, ln: np.ndarray, ids: np.ndarray, P: int, gap: int
) -> np.ndarray:
    """Bytes each of the P shares of the sorted *ids* reads when its records are merged
    across holes of at most *gap* bytes (holes included): one vectorised
    :func:`~feedline.plan.extents.merge_extents` over all shares, never merging two."""
    n = len(ids)
    out = np.zeros(P, dtype=np.int64)
    if n == 0:
        return out
    share = np.repeat(np.arange(P, dtype=np.int64), np.diff(floor_start(n, P, np.arange(P + 1))))
    f, o, L = fid[ids], off[ids], ln[ids]
    order = np.lexsort((o, f, share))
    f, o, L, share = f[order], o[order], L[order], share[order]
    cut = np.ones(n, dtype=bool)
    cut[1:] = share[1:] != share[:-1]
    first, end, _ = merge_extents(f, o, L, gap, cut=cut)
    np.add.at(out, share[first], end - o[first])
    return out


def place_shares(
    fid: np.ndarray,
    off: np.ndarray,
    ln: np.ndarray,
    ids: np.ndarray,
    P: int,
    gap: int,
    slot: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Where the records of a round's sorted *ids* land in the store, for all *P* shares
    at once: ``(owner, src)`` per id, the rank holding it and its offset in that rank's
    slot. Each share's records are merged across holes of at most *gap* bytes and read
    into the slot in (file, offset) order; a share whose merged reads would outgrow the
    *slot* bytes is read record by record (gap 0) instead — what
    :func:`~feedline.pipeline.reader.coalesce` gives each share alone, vectorised."""
    n = len(ids)
    if n == 0:
        z = np.zeros(0, dtype=np.int64)
        return z.astype(np.int32), z
    counts = np.diff(floor_start(n, P, np.arange(P + 1)))
    share = np.repeat(np.arange(P, dtype=np.int64), counts)
    f, o, L = fid[ids], off[ids], ln[ids]
    in_order = bool(((f[1:] > f[:-1]) | ((f[1:] == f[:-1]) & (o[1:] >= o[:-1]))).all())
    # ids in file order already (a file written in id order): no sort needed
    order = np.arange(n) if in_order else np.lexsort((o, f, share))
    f, o, L, sh = f[order], o[order], L[order], share[order]
    cut = np.ones(n, dtype=bool)
    cut[1:] = sh[1:] != sh[:-1]

    def merged(g):
        first, end, which = merge_extents(f, o, L, g, cut=cut)
        size = end - o[first]
        return first, size, which

    first, size, which = merged(gap)
    total = np.zeros(P, dtype=np.int64)
    np.add.at(total, sh[first], size)
    over = total > slot
    if over.any():  # those shares record by record (no holes read through)
        first, size, which = merged(np.where(over[sh], 0, gap).astype(np.int64))
    # each merged read's place in its share's slot: an exclusive running sum per share
    csum = np.cumsum(size) - size
    start_of_share = np.zeros(P, dtype=np.int64)
    r_share = sh[first]
    head = np.ones(len(first), dtype=bool)
    head[1:] = r_share[1:] != r_share[:-1]
    start_of_share[r_share[head]] = csum[head]
    dest = csum - start_of_share[r_share]
    src_sorted = dest[which] + (o - o[first][which])
    src = np.empty(n, dtype=np.int64)
    src[order] = src_sorted
    owner = np.empty(n, dtype=np.int32)
    owner[order] = sh
    return owner, src


def gap_of(plan) -> int:
    """The holes a load of *plan* reads through: ``coalesce_gap``, or :data:`STORE_GAP`."""
    return int(plan.strategy.coalesce_gap) or STORE_GAP


def slot_sizes(
    fid, off, ln, plan, P: int, rounds: _Rounds | None = None, cache=None, need: bool = False
) -> np.ndarray:
    """Bytes of every slot of the store for *plan* on *P* ranks: a rank's share of a
    round, the holes its load reads through included. The same on every rank (from the
    plan and the index only). With one round (R = 1), every share's exact bytes. Slots
    reused by the rounds of a pass (R < 1, a new layout every pass) are all of the
    largest round's size, a bound for every seed: the largest ``per`` lengths (a share
    read record by record; ``per`` the most records a share of a round holds, its units
    counted whole), grown by the dataset's proportion of holes + 2% (a share that would
    not fit that is read record by record). A progressive store's (one slot per round,
    kept) each of its own round's: its largest share for the seed (which fixes the
    layout) + 2% (:data:`_SEED_MARGIN`), or that bound when smaller. Another seed's layout
    (a state loaded) may need more: :meth:`~feedline.sources.store.StoreSource.start`
    then regrows the store, whose rounds that seed reloads anyway.
    *cache* (a dict) keeps what does not change between epochs. *need*: the least each
    slot must hold instead (a progressive store's largest shares, without the margin;
    else the sizes), what a store already allocated is checked against."""
    rounds = rounds if rounds is not None else _Rounds(plan)
    cache = {} if cache is None else cache
    gap = gap_of(plan)
    if rounds.whole:
        key: tuple = ("whole", plan.n, P, gap)
        if key not in cache:
            sizes = share_bytes(fid, off, ln, np.arange(plan.n, dtype=np.int64), P, gap)
            cache[key] = int(sizes.max()) if len(sizes) else 0
        return np.array([cache[key]], dtype=np.int64)
    if rounds.progressive:  # a round of whole units, whatever the seed places last
        lens = np.diff(rounds.stream.cuts) * rounds.stream.g
    else:
        lens = np.full(rounds.slots, (rounds.hi - rounds.lo).max())
    per = -(-np.minimum(lens, len(ln)) // P)
    if ("sorted",) not in cache:
        cache[("sorted",)] = np.concatenate([[0], np.cumsum(np.sort(ln)[::-1])])
    slot = cache[("sorted",)][per]  # the largest per lengths
    hkey: tuple = ("holes", gap)
    if hkey not in cache:
        whole = int(share_bytes(fid, off, ln, np.arange(len(ln), dtype=np.int64), 1, gap)[0])
        cache[hkey] = whole / max(int(ln.sum()), 1)
    grown = np.ceil(slot * cache[hkey] * _HOLE_MARGIN).astype(np.int64)
    bound = np.maximum(slot, grown).astype(np.int64)
    if rounds.progressive:  # never over the bound: the same as before for equal records
        exact = _round_shares(fid, off, ln, plan, P, rounds, gap, cache)
        grown = exact if need else np.ceil(exact * _SEED_MARGIN).astype(np.int64)
        return np.minimum(bound, grown)
    return bound


def _round_shares(fid, off, ln, plan, P: int, rounds: _Rounds, gap: int, cache) -> np.ndarray:
    """A progressive store's slots: each round's largest share, exactly (its layout is
    fixed by the seed: :func:`~feedline.plan.assign_memory.layout_stream`)."""
    st = rounds.stream
    key = (
        "rounds",
        int(plan.seed),
        plan.n,
        plan.strategy.assignment,
        int(st.g),
        np.asarray(st.cuts).tobytes(),
        P,
        gap,
    )
    if key not in cache:
        cache[key] = np.array(
            [
                int(share_bytes(fid, off, ln, rounds.ids(r), P, gap).max())
                for r in range(rounds.count)
            ],
            dtype=np.int64,
        )
    return cache[key].copy()


def slot_cache(index) -> dict:
    """:func:`slot_sizes`' cache, kept with *index* (its keys name every other input):
    the Loader's check of the store's slots against the cap and the store itself then
    work each layout's shares out once."""
    cache = getattr(index, "_slot_cache", None)
    if cache is None:
        cache = {}
        with contextlib.suppress(AttributeError, TypeError):
            index._slot_cache = cache
    return cache


def store_bytes(index, plan, P: int) -> int:
    """Bytes a rank of the store holds for *plan* on *P* ranks (its slots)."""
    fid, off, ln = (
        np.asarray(a, dtype=np.int64) for a in (index.file_ids, index.offsets, index.lengths)
    )
    return int(slot_sizes(fid, off, ln, plan, P, _Rounds(plan), slot_cache(index)).sum())


# ------------------------------------------------- the store as the feedline preset's choice


def store_unavailable(world, explicit_source: str | None, window_knobs: dict[str, Any]) -> str:
    """Why the DeepIO store cannot be the ``feedline`` preset's choice for a Loader of
    *world* ("": it can): another source asked for, window knobs given, no MPI world for
    a job of several ranks, or an MPI without ``MPI_THREAD_MULTIPLE``."""
    if explicit_source not in (None, "store"):
        return f"source={explicit_source!r} asked for"
    if window_knobs:
        return f"window knobs given ({', '.join(sorted(window_knobs))})"
    if world.size > 1:
        if world.dist is None:
            return "it needs an MPI world (this job has none)"
        from ..dist import ops as mpi

        try:
            mpi.require_thread_multiple("the DeepIO store")
        except ConfigError:
            return "MPI runs without MPI_THREAD_MULTIPLE"
    return ""


def checked_choice(
    pick, store: bool | str, index, choose_args: tuple, seed: int, asked: str, threads: int = 0
):
    """The cost model's choice (``pick(store)``, :func:`~feedline.plan.cost.choose`),
    checked against the store's exact slots when *index* is known (:func:`store_overflow`):
    over the cap, the model chooses again without the store (*asked* ``"auto"``), or a
    store asked for (``"ordered"``, ``"opportunistic"``) raises :class:`ConfigError`.
    What the Loader runs and what ``feedline plan DATASET`` shows. *threads*: the I/O
    threads of the store's reader (0: the default), whose bounce buffers count too."""
    choice = pick(store)
    over = (
        store_overflow(index, choice.strategy, choose_args, seed, threads)
        if index is not None
        else ""
    )
    if over and asked == "auto":  # the closed form was short: windows only
        return pick(over)
    if over:
        raise ConfigError(f"store={asked!r}: {over}")
    return choice


def store_overflow(index, strategy, choose_args: tuple, seed: int, threads: int = 0) -> str:
    """When the cost model chose the store (*strategy*; *choose_args* are ``choose``'s
    records, world, batch size, cap per node): "" when its exact slots (holes and the
    largest shares included) and its reader's bounce buffers (*threads* I/O threads, 0:
    the default; the store loads with ``odirect`` unless told otherwise, and a knob set
    later is not known here, so they are always counted) fit the cap, else why not (the
    model assumes equal shares)."""
    if strategy.store not in ("ordered", "opportunistic"):
        return ""
    from .. import defaults
    from ..pipeline.reader import ExtentReader
    from ..plan.plan import make_plan
    from ..units import format_bytes

    threads = threads or int(defaults.get("io_threads"))
    reserve = ExtentReader.bounce_bytes("odirect", threads)

    records, world, batch, cap = choose_args[:4]
    plan = make_plan(records, world, strategy, seed, 0, batch, memory_cap=cap)
    need = -(-world.size // world.nodes) * (store_bytes(index, plan, world.size) + reserve)
    if need <= cap:
        return ""
    return (
        f"memory cap: the store's slots and read buffers need {format_bytes(need)} per node, over the "
        f"{format_bytes(cap)} left of the cap for reading"
    )
