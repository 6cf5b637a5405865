"""DeepIO beyond the store's mechanics: the opportunistic order, its RL, the store as a
cost-model candidate, and the portable API (§III-C, §III-D)."""

from __future__ import annotations

import numpy as np
import pytest

from feedline.pipeline.store import _Rounds, _share
from feedline.plan import FlatRecords, WorldSpec, get_strategy, make_plan
from feedline.plan.cost import PROFILES, estimate, shape_of
from feedline.plan.rl import randomization_level, rl_memory
from feedline.plan.store_cost import store_estimate


def _plans(n, P, M, R, B, seed=4, epoch=1):
    kw = {"memory_fraction": R}
    rec = FlatRecords(n, 100)
    opp = make_plan(rec, WorldSpec(P, M), get_strategy("deepio-opportunistic", **kw), seed, epoch, B)
    ordd = make_plan(rec, WorldSpec(P, M), get_strategy("deepio-ordered", **kw), seed, epoch, B)
    return opp, ordd


def _owner(plan):
    rounds = _Rounds(plan)
    owner = np.zeros(plan.n, dtype=np.int64)
    for r in range(rounds.count):
        ids = rounds.ids(r)
        for k in range(plan.world.size):
            owner[_share(ids, plan.world.size, k)] = k
    return rounds, owner


@pytest.mark.parametrize(("P", "M"), [(1, 1), (2, 1), (4, 2), (8, 4)])
@pytest.mark.parametrize("R", [1.0, 0.3])
def test_opportunistic_order_is_exact_local_first_and_a_pure_function(P, M, R):
    n, B = 64 * 23 + 9, 50
    opp, ordd = _plans(n, P, M, R, B)
    order = opp.order()
    assert np.array_equal(np.sort(order), np.arange(n))  # exactly once
    rounds, owner = _owner(opp)
    for r in range(rounds.count):  # the same samples in each round as the ordered mode
        pos = np.arange(rounds.lo[r], rounds.hi[r])
        assert np.array_equal(np.sort(opp.ids_at(pos)), np.sort(ordd.ids_at(pos)))
    local = sum(int((owner[opp.rank_samples(k)[0]] == k).sum()) for k in range(P))
    local_ord = sum(int((owner[ordd.rank_samples(k)[0]] == k).sum()) for k in range(P))
    assert local >= 0.95 * n and local >= local_ord
    if P > 1:
        assert local_ord < 0.7 * n
    again, _ = _plans(n, P, M, R, B)
    assert np.array_equal(again.order(), order)  # pure in (seed, epoch, world, R)
    other, _ = _plans(n, P, M, R, B, epoch=2)
    assert not np.array_equal(other.order(), order)
    for step in (0, 1, opp.num_steps // 2, opp.num_steps - 1):
        rest = opp.resume(step)
        assert np.array_equal(rest.order(), order[step * B :])
        assert np.array_equal(rest.samples(P - 1, step), opp.samples(P - 1, step))
    # resuming on another world re-cuts the same remaining order
    moved = opp.resume(3, WorldSpec(max(1, P // 2), 1))
    assert np.array_equal(moved.order(), order[3 * B :])


def test_opportunistic_depends_on_the_world_and_drop_last_stays_exact():
    a, _ = _plans(3000, 4, 2, 0.25, 64)
    b, _ = _plans(3000, 8, 4, 0.25, 64)
    assert not np.array_equal(a.order(), b.order())
    rec = FlatRecords(3000, 100)
    st = get_strategy("deepio-opportunistic", memory_fraction=0.25)
    p = make_plan(rec, WorldSpec(4, 2), st, 1, 0, 64, drop_last=True)
    got = p.order()
    assert len(got) == (3000 // 64) * 64 and len(np.unique(got)) == len(got)


def test_rl_of_opportunistic_is_the_rank_stratified_shuffle():
    # P = 1: the ordered mode's value (the paper's worked numbers)
    assert rl_memory(7660, 0.5, ranks=1) == pytest.approx(0.9854, abs=5e-5)
    assert rl_memory(7660, 0.25, ranks=1) == pytest.approx(0.9696, abs=5e-5)
    vals = [rl_memory(7660, 1.0, ranks=P) for P in (1, 2, 4, 8)]
    assert vals[0] == pytest.approx(1.0)
    assert all(a > b for a, b in zip(vals, vals[1:], strict=False))  # lower with more ranks
    opp, ordd = _plans(7660, 8, 4, 0.5, 128)
    assert randomization_level(ordd) == pytest.approx(rl_memory(7660, 0.5, unit=64))
    assert randomization_level(opp) == pytest.approx(rl_memory(7660, 0.5, unit=64, ranks=8))
    assert randomization_level(opp) < randomization_level(ordd)


def test_store_estimate_terms():
    rec = FlatRecords(204_800, 3072)  # 3,200 units of 64
    sh = shape_of(rec, WorldSpec(8, 4), 256, 2_500_000_000)
    prof = PROFILES["parallel"]
    first = store_estimate(sh, prof, 1.0, epoch=0)
    later = store_estimate(sh, prof, 1.0, epoch=1)
    half = store_estimate(sh, prof, 0.5, epoch=1)
    opp = store_estimate(sh, prof, 1.0, mode="opportunistic", epoch=1)
    assert not first.rejected and first.terms["transfer"] > 0 and first.bytes > 0
    assert later.terms["transfer"] == later.terms["latency"] == 0 == later.bytes  # in memory
    assert half.terms["transfer"] > 0 and half.windows_per_unit == 2  # R < 1 reloads
    assert half.memory_per_node == pytest.approx(later.memory_per_node)  # 2R = 1
    assert opp.knobs["remote_gets"] == 0 < later.knobs["remote_gets"]
    assert opp.terms["serve"] < later.terms["serve"]
    assert opp.rl < later.rl == pytest.approx(1.0)
    # the first epoch pays the load on top of what every epoch pays; comparable with a
    # window candidate's estimate (same Estimate, same term names)
    load = first.terms["latency"] + first.terms["transfer"] + first.terms["first_window"]
    assert first.cost == pytest.approx(later.cost + load + first.terms["coordination"])
    window = estimate(sh, prof, "rank", 8 << 20, 0)
    assert set(window.terms) <= set(later.terms) and window.cost > 0
    small_cap = shape_of(rec, WorldSpec(8, 4), 256, 10_000_000)
    assert "memory cap" in store_estimate(small_cap, prof, 1.0).rejected
    assert not store_estimate(small_cap, prof, 0.02).rejected
