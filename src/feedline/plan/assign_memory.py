"""``memory(R)``: DeepIO's hybrid backend-memory order (§III-B/C). The dataset is cut
into units of g contiguous samples (its "files"); each round loads a random selection of
R·(units) into the job's memory, drawn without replacement, and the samples in memory are
permuted completely. R = 1 is one full permutation. The lower R, the less random
(DeepIO's RL), but only a fraction R of the dataset must fit in memory.

With ``store="opportunistic"`` (DeepIO §III-C's entropy-aware opportunistic ordering)
each round's samples are the same, but placed *locality first*: the DeepIO store puts
rank k's share of a round (the k-th of P equal runs of the round's sorted ids) in rank
k's memory, and each rank's positions of the round take, in the seeded order, the
samples it holds itself; the rest (shares larger than a rank's positions in the round)
go to ranks of the same node first, then to any rank. The order stays a pure function
of (seed, epoch, world, R): exactly-once and resume hold, but the order depends on P
and the nodes (each rank draws from its own share: a rank-stratified shuffle, RL by
:func:`feedline.plan.rl.rl_memory` with ``ranks=P``)."""

from __future__ import annotations

import numpy as np

from ._perm import derive_key, permute, subkeys
from .layout import _rank_of
from .streams import Assignment, GroupSlots, register

DEFAULT_UNIT = 64


class MemoryStream:
    def __init__(self, n: int, g: int, fraction: float, key: np.uint64) -> None:
        self.n, self.g = n, g
        self.slots = GroupSlots(n, g, key)
        units = self.slots.groups
        self.per_round = max(1, round(fraction * units)) if units else 1
        self.rounds = -(-units // self.per_round) if units else 0
        self.inner = derive_key(int(key), 0x4D454D52)  # "MEMR"

    def round_bounds(self, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """First and one-past-last position of rounds *r*."""
        r = np.asarray(r, dtype=np.int64)
        lo_slot = r * self.per_round
        hi_slot = np.minimum(lo_slot + self.per_round, self.slots.groups)
        lo = self.slots.slot_start(lo_slot)
        hi = np.where(hi_slot >= self.slots.groups, self.n, self.slots.slot_start(hi_slot))
        return lo, hi

    def take(self, q: np.ndarray) -> np.ndarray:
        q = np.asarray(q, dtype=np.int64)
        # round of q: slot of q // per_round
        slot, _, _ = self.slots.locate(q)
        r = slot // self.per_round
        lo, hi = self.round_bounds(r)
        inner = permute(q - lo, hi - lo, subkeys(self.inner, r))
        _, group, off = self.slots.locate(lo + inner)
        return group * self.g + off


def _match(src_key: np.ndarray, dst_key: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Pair elements with positions of the same key, in order within each key: the
    indices (into *src_key*, *dst_key*) of the pairs, aligned, as many per key as the
    smaller side has."""
    so = np.argsort(src_key, kind="stable")
    do = np.argsort(dst_key, kind="stable")
    cs = np.bincount(src_key, minlength=k)
    cd = np.bincount(dst_key, minlength=k)
    m = np.minimum(cs, cd)
    ks, kd = src_key[so], dst_key[do]
    rs = np.arange(len(so)) - np.repeat(np.cumsum(cs) - cs, cs)
    rd = np.arange(len(do)) - np.repeat(np.cumsum(cd) - cd, cd)
    return so[rs < m[ks]], do[rd < m[kd]]


class OpportunisticStream(MemoryStream):
    """``memory(R)`` placed locality first for the DeepIO store of a world of P ranks on
    M nodes (see the module docstring). Rounds are computed when first asked for."""

    wraps = False

    def __init__(self, n: int, g: int, fraction: float, key: np.uint64, geo) -> None:
        super().__init__(n, g, fraction, key)
        self.B, self.P, self.M, self.total = geo.B, geo.P, geo.M, geo.total
        self._geo = geo
        self._rounds: dict[int, np.ndarray] = {}

    def owner_of(self, base: np.ndarray) -> np.ndarray:
        """The rank holding each of a round's samples (*base*: all of them): rank k
        holds the k-th of P equal runs of their sorted ids (the store's placement)."""
        n_r = len(base)
        idx = np.empty(n_r, dtype=np.int64)
        idx[np.argsort(base, kind="stable")] = np.arange(n_r, dtype=np.int64)
        bounds = np.arange(self.P + 1, dtype=np.int64) * n_r // self.P
        return np.searchsorted(bounds, idx, side="right") - 1

    def round_order(self, r: int) -> np.ndarray:
        """Sample ids at the positions of round *r*, locality first."""
        got = self._rounds.get(r)
        if got is not None:
            return got
        lo_a, hi_a = self.round_bounds(np.array([r], dtype=np.int64))
        lo, hi = int(np.asarray(lo_a).reshape(-1)[0]), int(np.asarray(hi_a).reshape(-1)[0])
        pos = np.arange(lo, hi, dtype=np.int64)
        base = MemoryStream.take(self, pos)  # the seeded order (ordered mode)
        P, M = self.P, self.M
        own = self.owner_of(base)
        s, o = np.divmod(pos, self.B)
        live = pos < self.total  # positions a drop_last epoch never delivers: nobody's
        L = np.maximum(self._geo.step_len(s), 1)
        prk = np.where(live, _rank_of(o, L, P)[0], P)
        out = np.full(hi - lo, -1, dtype=np.int64)
        free_e = np.ones(hi - lo, dtype=bool)
        free_p = np.ones(hi - lo, dtype=bool)
        # 1: what the rank holds; 2: what its node holds; 3: the rest, in seeded order
        tiers = [(own, prk, P + 1)]
        if M > 1:
            tiers.append((own * M // P, np.where(live, prk * M // P, M), M + 1))
        for ek, pk, k in tiers:
            e_idx, p_idx = np.flatnonzero(free_e), np.flatnonzero(free_p)
            se, sp = _match(ek[e_idx], pk[p_idx], k)
            out[p_idx[sp]] = base[e_idx[se]]
            free_e[e_idx[se]] = False
            free_p[p_idx[sp]] = False
        out[free_p] = base[free_e]
        self._rounds[r] = out
        return out

    def take(self, q: np.ndarray) -> np.ndarray:
        q = np.asarray(q, dtype=np.int64)
        if len(q) == 0 or self.n == 0:
            return np.zeros(len(q), dtype=np.int64)
        slot, _, _ = self.slots.locate(q)
        rnd = slot // self.per_round
        out = np.empty(len(q), dtype=np.int64)
        lo, _ = self.round_bounds(rnd)
        for r in np.unique(rnd).tolist():
            sel = rnd == r
            out[sel] = self.round_order(r)[q[sel] - lo[sel]]
        return out


def _make(n: int, strategy, key: np.uint64, geo, records) -> MemoryStream:
    g = unit_size(n, strategy)
    if strategy.store == "opportunistic":
        return OpportunisticStream(n, g, strategy.memory_fraction, key, geo)
    return MemoryStream(n, g, strategy.memory_fraction, key)


def unit_size(n: int, strategy) -> int:
    g = strategy.chunk or DEFAULT_UNIT
    return max(1, min(g, max(n, 1)))


ASSIGNMENT = register(
    Assignment(
        name="memory",
        make=lambda n, strategy, key: MemoryStream(
            n, unit_size(n, strategy), strategy.memory_fraction, key
        ),
        layout=lambda strategy: "row",
        world_independent=lambda strategy: strategy.store != "opportunistic",
        make_geo=_make,
    )
)
