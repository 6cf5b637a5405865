# SPDX-License-Identifier: Apache-2.0
"""``memory(R)``: DeepIO's hybrid backend-memory order (§III-B/C). The dataset is cut
into units of g contiguous samples (its "files"); each round loads a random selection of
R·(units) into the job's memory, drawn without replacement, and the samples in memory are
permuted completely. R = 1 is one full permutation. The lower R, the less random
(DeepIO's RL), but only a fraction R of the dataset must fit in memory.

With ``store="opportunistic"`` (DeepIO §III-C's entropy-aware opportunistic ordering)
each round's samples are the same, but placed *locality first*: the DeepIO store puts
rank k's share of a round (the k-th of P equal runs of the round's sorted ids) in rank
k's memory, and each rank's positions of the round take its own share, permuted by a
key of (seed, epoch, round, rank); what is left of the shares larger than their rank's
positions in the round goes, in rank order, to the ranks with fewer (a round boundary
inside a step makes a few). The order stays a pure function of (seed, epoch, world, R):
exactly-once and resume hold, but the order depends on P (each rank draws from its own
share: a rank-stratified shuffle, RL by :func:`feedline.plan.rl.rl_memory` with
``ranks=P``); each rank computes its positions in O(its samples + units of a round)."""

from __future__ import annotations

import numpy as np

from ._perm import derive_key, permute, subkeys
from .layout import even_part, even_start, floor_start
from .rl import DEFAULT_UNIT, ramp_floor, round_cuts, unit_size
from .stream import Assignment, GroupSlots


class MemoryStream:
    """``memory(R)``'s order: rounds of ``R`` of the units (*ramp* > 0: growing first
    rounds, :func:`~feedline.plan.rl.round_cuts`, a progressive store's first epoch)."""

    def __init__(self, n: int, g: int, fraction: float, key: np.uint64, ramp: int = 0) -> None:
        self.n, self.g = n, g
        self.slots = GroupSlots(n, g, key)
        units = self.slots.groups
        self.per_round = max(1, round(fraction * units)) if units else 1
        #: the first unit slot of every round, and the units last
        self.cuts = round_cuts(units, self.per_round, ramp)
        self.rounds = len(self.cuts) - 1
        self.inner = derive_key(int(key), 0x4D454D52)  # "MEMR"

    def round_bounds(self, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """First and one-past-last position of rounds *r*."""
        r = np.asarray(r, dtype=np.int64)
        lo_slot, hi_slot = self.cuts[r], self.cuts[r + 1]
        lo = self.slots.slot_start(lo_slot)
        hi = np.where(hi_slot >= self.slots.groups, self.n, self.slots.slot_start(hi_slot))
        return lo, hi

    def round_ids(self, r: int) -> np.ndarray:
        """Round *r*'s sample ids, sorted: the units (groups of g contiguous samples) of
        its slots, so one permutation per unit, not per sample."""
        lo, hi = int(self.cuts[r]), int(self.cuts[r + 1])
        groups = np.sort(self.slots.group_at(np.arange(lo, hi, dtype=np.int64)))
        sizes = self.slots.size_of_group(groups).astype(np.int64)
        starts = groups * self.g
        ends = np.cumsum(sizes)
        ids = np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64)
        ids += np.repeat(starts - (ends - sizes), sizes)
        return ids

    def take(self, q: np.ndarray) -> np.ndarray:
        q = np.asarray(q, dtype=np.int64)
        # round of q: the round whose cuts hold q's unit slot
        slot, _, _ = self.slots.locate(q)
        r = np.searchsorted(self.cuts, slot, side="right") - 1
        lo, hi = self.round_bounds(r)
        inner = permute(q - lo, hi - lo, subkeys(self.inner, r))
        _, group, off = self.slots.locate(lo + inner)
        return group * self.g + off


class OpportunisticStream(MemoryStream):
    """``memory(R)`` placed locality first for the DeepIO store of a world of P ranks
    (see the module docstring). Evaluated at any positions in O(len(positions) + P)
    plus O(units of a round) once per round touched: rank k's positions of round r take
    rank k's share of the round's sorted ids, permuted by a key of (seed, epoch, r, k);
    a rank with more positions than its share takes, in rank order, the tails of the
    shares of ranks with fewer (positions a ``drop_last`` epoch never delivers count as
    a last pseudo-rank's)."""

    def __init__(self, n: int, g: int, fraction: float, key: np.uint64, geo, ramp: int = 0) -> None:
        super().__init__(n, g, fraction, key, ramp)
        self.B, self.P, self.total = geo.B, geo.P, geo.total
        self._geo = geo
        self.opp = derive_key(int(key), 0x4F505054)  # "OPPT"
        r = np.arange(self.rounds, dtype=np.int64)
        lo, hi = self.round_bounds(r) if self.rounds else (np.zeros(1), np.zeros(1))
        self._lo = np.atleast_1d(np.asarray(lo, dtype=np.int64))
        self._hi = np.atleast_1d(np.asarray(hi, dtype=np.int64))
        self._sorted: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    # -- where positions go ----------------------------------------------------------
    def _count(self, k, p):
        """Positions < p that rank k consumes (k = P: positions never delivered)."""
        p = np.asarray(p, dtype=np.int64)
        k = np.asarray(k, dtype=np.int64)
        P, B, T = self.P, self.B, self.total
        pc = np.minimum(p, T)
        s, o = np.divmod(pc, B)
        L = np.maximum(np.minimum(B, T - s * B), 0)
        kk = np.minimum(k, P - 1)
        full = s * (even_start(B, P, kk + 1) - even_start(B, P, kk))
        a, b = even_start(L, P, kk), even_start(L, P, kk + 1)
        mine = full + np.clip(o - a, 0, b - a)
        return np.where(k == P, np.maximum(p - T, 0), mine)

    def _rank(self, p):
        p = np.asarray(p, dtype=np.int64)
        s, o = np.divmod(p, self.B)
        L = np.maximum(self._geo.step_len(s), 1)
        return np.where(p < self.total, even_part(o, L, self.P)[0], self.P)

    # -- what the ranks hold -----------------------------------------------------------
    def _round_ids(self, r: int, idx: np.ndarray) -> np.ndarray:
        """The round's sorted ids at indices *idx* (the store's placement order)."""
        if self.rounds <= 1:
            return idx
        got = self._sorted.get(r)
        if got is None:
            lo, hi = int(self.cuts[r]), int(self.cuts[r + 1])
            groups = np.sort(self.slots.group_at(np.arange(lo, hi, dtype=np.int64)))
            sizes = self.slots.size_of_group(groups).astype(np.int64)
            got = (groups, np.cumsum(sizes), sizes)
            self._sorted = {r: got}  # rounds are asked for in order
        groups, cum, sizes = got
        u = np.searchsorted(cum, idx, side="right")
        return groups[u] * self.g + idx - (cum[u] - sizes[u])

    def take(self, q: np.ndarray) -> np.ndarray:
        q = np.asarray(q, dtype=np.int64)
        out = np.empty(len(q), dtype=np.int64)
        if len(q) == 0:
            return out
        P = self.P
        rnd = np.searchsorted(self._lo, q, side="right") - 1
        ks = np.arange(P + 1, dtype=np.int64)
        for r in np.unique(rnd).tolist():
            sel = np.flatnonzero(rnd == r)
            lo, hi = int(self._lo[r]), int(self._hi[r])
            n_r = hi - lo
            start = np.append(floor_start(n_r, P, ks[:P]), n_r)  # share k: [start_k, start_k+1)
            size = np.append(np.diff(start), 0)  # the pseudo-rank P holds nothing
            npos = self._count(ks, hi) - self._count(ks, lo)
            m = np.minimum(size, npos)
            sur_end = np.cumsum(size - m)
            def_start = np.cumsum(npos - m) - (npos - m)
            pq = q[sel]
            k = self._rank(pq)
            j = self._count(k, pq) - self._count(k, lo)
            local = j < m[k]
            # the share and the index in its permutation of every position
            d = def_start[k] + j - m[k]
            k2 = np.where(local, k, np.searchsorted(sur_end, d, side="right"))
            i2 = np.where(local, j, m[k2] + d - (sur_end[k2] - (size[k2] - m[k2])))
            keys = subkeys(self.opp, r * (P + 1) + k2)
            pos = permute(i2, np.maximum(size[k2], 1), keys)
            out[sel] = self._round_ids(r, start[k2] + pos)
        return out


def load_rounds(strategy) -> int:
    """K > 1 when the DeepIO store loads R = 1 progressively (``load_rounds``: epoch 0
    is ``memory(1/K)``'s order, every round stays in memory); else 0."""
    K = int(strategy.load_rounds)
    progressive = (
        K > 1
        and strategy.assignment == "memory"
        and strategy.memory_fraction >= 1.0
        and strategy.store in ("ordered", "opportunistic")
    )
    return K if progressive else 0


def epoch_strategy(strategy, epoch: int):
    """The strategy whose ``memory(R)`` order *epoch* follows: a progressive store's
    epoch 0 is ``memory(1/K)``'s (:func:`layout_stream`); every other epoch its own."""
    K = load_rounds(strategy) if int(epoch) == 0 else 0
    if not K:
        return strategy
    # the unit stays the store's (R = 1: layout_stream, epoch_ramp): memory(1/K) alone
    # would take smaller units on a small dataset (rl.memory_unit), and epoch 0 would
    # read rounds other than the ones the store loads
    return strategy.replace(memory_fraction=1.0 / K, chunk=strategy.chunk or DEFAULT_UNIT)


def epoch_ramp(strategy, epoch: int, n: int, batch: int) -> int:
    """The *ramp* of :func:`~feedline.plan.rl.round_cuts` for *epoch* of *strategy*
    (global batch *batch*): a progressive store's epoch 0 ramps its rounds up, from a
    first round that holds the first step; every other order is uniform (0)."""
    if int(epoch) != 0 or not load_rounds(strategy):
        return 0
    return ramp_floor(batch, unit_size(n, strategy))


def layout_stream(n: int, strategy, seed: int, batch: int) -> MemoryStream | None:
    """The rounds a progressive store loads (epoch 0's ``memory(1/K)``, ramped up for a
    global batch of *batch*, whatever the epoch being served: the store's layout), or
    None when it loads in one round."""
    from .plan import epoch_key

    K = load_rounds(strategy)
    if not K:
        return None
    key = epoch_key(int(seed), 0, strategy.assignment)
    ramp = epoch_ramp(strategy, 0, n, batch)
    stream = MemoryStream(n, unit_size(n, strategy), 1.0 / K, key, ramp)
    return stream if stream.rounds > 1 else None


def _make(n: int, strategy, key: np.uint64, geo, records, epoch: int = 1) -> MemoryStream:
    """*epoch*'s order of *strategy* (a progressive store's epoch 0: ``memory(1/K)``,
    ramped up)."""
    ramp = epoch_ramp(strategy, epoch, n, geo.B)
    s = epoch_strategy(strategy, epoch)
    g = unit_size(n, s)
    if s.store == "opportunistic":
        return OpportunisticStream(n, g, s.memory_fraction, key, geo, ramp)
    return MemoryStream(n, g, s.memory_fraction, key, ramp)


ASSIGNMENT = Assignment(
    name="memory",
    make=lambda n, strategy, key: MemoryStream(
        n, unit_size(n, strategy), strategy.memory_fraction, key
    ),
    layout=lambda strategy: "row",
    world_independent=lambda strategy: strategy.store != "opportunistic",
    make_geo=_make,
)
