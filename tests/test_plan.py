# SPDX-License-Identifier: Apache-2.0
"""Planner invariants (pure; Hypothesis over world sizes, nodes, batch sizes, N)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feedline.errors import ConfigError, StateError
from feedline.plan import (
    PRESETS,
    FlatRecords,
    IndexRecords,
    Strategy,
    WorldSpec,
    epoch_order,
    get_strategy,
    make_plan,
    num_steps,
    rank_samples,
    sub_batch_bounds,
)
from feedline.plan._perm import derive_key, permute
from feedline.plan.reads import PLAN_BYTES_PER_SAMPLE

ASSIGNMENT_STRATEGIES = [
    Strategy(assignment="strided"),
    Strategy(assignment="skip"),
    Strategy(assignment="contiguous"),
    Strategy(assignment="contiguous", region="node"),
    Strategy(assignment="global"),
    Strategy(assignment="chunk", chunk=3),
    Strategy(assignment="chunk", chunk=5, chunk_layout="rank"),
    Strategy(assignment="memory", chunk=2, memory_fraction=0.34),
]
WORLD_INDEPENDENT = {"strided", "global", "memory"}

settings.register_profile("feedline", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("feedline")


@st.composite
def jobs(draw, max_n=300):
    P = draw(st.integers(1, 64))
    M = draw(st.integers(1, min(P, 8)))
    n = draw(st.one_of(st.integers(0, max_n), st.sampled_from([1, 2, 3, 5, 7, 11, 13, 97, 101])))
    B = draw(st.integers(1, 80))
    drop = draw(st.booleans())
    return n, WorldSpec(P, M), B, drop


def delivered(plan):
    """Every (step, rank) sub-batch: whole steps cut at the sub-batch bounds, checked
    against the per-rank API on a spread of (rank, step) pairs."""
    B, P = plan.batch_size, plan.world.size
    out = []
    for s in range(plan.num_steps):
        ids = plan.ids_at(np.arange(s * B, s * B + plan.step_len(s)))
        b = sub_batch_bounds(len(ids), P)
        out.append([ids[b[r] : b[r + 1]] for r in range(P)])
    for s in {0, plan.num_steps // 2, plan.num_steps - 1} if plan.num_steps else ():
        for r in {0, P // 3, P - 1}:
            assert np.array_equal(plan.samples(r, s), out[s][r])
    return out


# ------------------------------------------------------------------ arithmetic


@given(st.integers(0, 10_000), st.integers(1, 64))
def test_sub_batch_bounds(L, P):
    b = sub_batch_bounds(L, P)
    sizes = np.diff(b)
    assert b[0] == 0 and b[-1] == L and len(b) == P + 1
    assert sizes.max() - sizes.min() <= 1
    assert (np.diff(sizes) <= 0).all()  # lower ranks take the extra


@given(st.integers(0, 10_000), st.integers(1, 500), st.booleans())
def test_num_steps(n, B, drop):
    s = num_steps(n, B, drop)
    assert s == (n // B if drop else -(-n // B))
    with pytest.raises(ConfigError):
        num_steps(n, 0)


@given(st.integers(1, 3000), st.integers(0, 2**32), st.booleans())
def test_keyed_permutation_is_a_bijection(n, seed, inverse):
    k = derive_key(seed)
    y = permute(np.arange(n), n, k, inverse=inverse)
    assert np.array_equal(np.sort(y), np.arange(n))
    assert np.array_equal(permute(y, n, k, inverse=not inverse), np.arange(n))


@given(
    st.lists(st.integers(1, 2**45), min_size=1, max_size=4),
    st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=4),
    st.integers(1, 300),
    st.integers(0, 2**32),
    st.booleans(),
)
def test_native_permutation_gives_the_reference_values(ns, keys, m, seed, inverse):
    """``feedline._core.permute`` gives bit for bit the values of the numpy expression it
    replaced (tests/perm_oracle.py), one n and key for all positions or one per
    position: every plan and checkpoint made before the change stays the same."""
    from perm_oracle import permute as reference

    rng = np.random.default_rng(seed)
    n = np.array(ns, dtype=np.int64)[rng.integers(0, len(ns), m)]
    key = np.array(keys, dtype=np.uint64)[rng.integers(0, len(keys), m)]
    x = (rng.random(m) * n).astype(np.int64)
    got = permute(x, n, key, inverse=inverse)
    assert np.array_equal(got, reference(x, n, key, inverse=inverse))
    one = permute(x % ns[0], ns[0], np.uint64(keys[0]), inverse=inverse)
    assert np.array_equal(one, reference(x % ns[0], ns[0], np.uint64(keys[0]), inverse=inverse))
    assert np.array_equal(permute(got, n, key, inverse=not inverse), x)


def test_native_permutation_refuses_positions_outside_the_domain():
    with pytest.raises(IndexError, match="outside the permutation's domain"):
        permute(np.array([0, 5]), 5, np.uint64(1))
    with pytest.raises(IndexError):
        permute(np.array([-1]), 5, np.uint64(1))
    assert permute(np.zeros((0,), np.int64), 5, np.uint64(1)).shape == (0,)
    scalar = permute(3, 10, 5)  # a scalar position gives a 0-d array, as it always did
    assert scalar.shape == () and int(scalar) == int(permute(np.array([3]), 10, 5)[0])
    grid = permute(np.arange(12).reshape(3, 4), np.array([[12], [12], [12]]), np.uint64(9))
    assert grid.shape == (3, 4) and sorted(grid.ravel().tolist()) == list(range(12))


# ----------------------------------------------------------- exactly once


@pytest.mark.parametrize(
    "strategy", ASSIGNMENT_STRATEGIES, ids=lambda s: f"{s.assignment}-{s.chunk_layout}-{s.region}"
)
@given(job=jobs(), seed=st.integers(0, 2**40), epoch=st.integers(0, 1000))
@settings(max_examples=25)
def test_exactly_once_and_equal_steps(strategy, job, seed, epoch):
    n, world, B, drop = job
    plan = make_plan(n, world, strategy, seed, epoch, B, drop)
    steps = delivered(plan)
    assert plan.num_steps == num_steps(n, B, drop)
    flat = [i for step in steps for sb in step for i in sb]
    expect = (n // B) * B if drop else n
    assert len(flat) == expect
    assert len(set(flat)) == len(flat)  # exactly once
    assert all(0 <= i < n for i in flat)
    if not drop:
        assert sorted(flat) == list(range(n))
    for s, step in enumerate(steps):
        sizes = [len(sb) for sb in step]
        assert sum(sizes) == plan.step_len(s) == min(B, expect - s * B)
        assert max(sizes) - min(sizes) <= 1
        assert sizes == sorted(sizes, reverse=True)
        assert np.array_equal(
            np.concatenate(step), plan.ids_at(np.arange(s * B, s * B + sum(sizes)))
        )
    # per-rank bulk view, node view and explicit-order view agree with samples()
    for r in {0, world.size - 1, world.size // 2}:
        ids, off = plan.rank_samples(r)
        for s in range(plan.num_steps):
            assert np.array_equal(ids[off[s] : off[s + 1]], steps[s][r])
    order = plan.order()
    for s in range(plan.num_steps):
        for node in {0, world.nodes - 1}:
            ranks = world.ranks_of(node)
            assert np.array_equal(
                plan.node_samples(node, s), np.concatenate([steps[s][r] for r in ranks])
            )
        assert np.array_equal(rank_samples(order, s, world.size - 1, world, B), steps[s][-1])


@pytest.mark.parametrize(
    "strategy", ASSIGNMENT_STRATEGIES, ids=lambda s: f"{s.assignment}-{s.chunk_layout}-{s.region}"
)
@given(
    n=st.integers(1, 200),
    seed=st.integers(0, 2**40),
    epoch=st.integers(0, 99),
    B=st.integers(1, 50),
)
@settings(max_examples=20)
def test_determinism_and_world_independence(strategy, n, seed, epoch, B):
    a = epoch_order(n, strategy, seed, epoch, world_size=3, batch_size=B)
    b = epoch_order(n, strategy, seed, epoch, world_size=3, batch_size=B)
    assert np.array_equal(a, b)
    independent = strategy.assignment in WORLD_INDEPENDENT or (
        strategy.assignment == "chunk" and strategy.chunk_layout == "column"
    )
    if independent:
        for P in (1, 2, 7, 64):
            assert np.array_equal(
                epoch_order(n, strategy, seed, epoch, world_size=P, batch_size=B), a
            )


def test_orders_follow_the_papers():
    n, B, P = 20, 6, 3
    assert epoch_order(n, "strided", batch_size=B).tolist() == list(range(20))
    # skip: in each step rank r takes s*B + r, s*B + r + P, ...
    plan = make_plan(n, P, "skip", batch_size=B)
    assert plan.samples(1, 0).tolist() == [1, 4]
    assert plan.samples(2, 1).tolist() == [8, 11]
    assert plan.samples(0, 3).tolist() == [18] and plan.samples(1, 3).tolist() == [19]
    # contiguous: each rank walks its own region front to back
    plan = make_plan(n, P, "contiguous", batch_size=B)
    for r in range(P):
        ids, _ = plan.rank_samples(r)
        assert (np.diff(ids) == 1).all()
    # global: a real shuffle that changes with seed and epoch
    g0 = epoch_order(1000, "global", seed=1, epoch=0)
    assert not np.array_equal(g0, np.arange(1000))
    assert not np.array_equal(g0, epoch_order(1000, "global", seed=1, epoch=1))
    assert not np.array_equal(g0, epoch_order(1000, "global", seed=2, epoch=0))
    # chunk: each aligned group of g samples stays together in the base sequence
    s = Strategy(assignment="chunk", chunk=10, chunk_layout="rank")
    order = epoch_order(1000, s, seed=5)
    groups = order.reshape(-1, 10) // 10
    assert (groups == groups[:, :1]).all()
    assert len(set(groups[:, 0].tolist())) == 100
    # memory(R): each round is a permutation of R of the units
    m = Strategy(assignment="memory", chunk=10, memory_fraction=0.25)
    order = epoch_order(1000, m, seed=5)
    rounds = (order // 10).reshape(4, 250)
    assert all(len(set(r.tolist())) == 25 for r in rounds)


def test_chunk_column_rank_reads_whole_groups():
    # every group is consumed by exactly one rank when groups do not straddle columns
    n, B, P, g = 4096, 64, 8, 8
    plan = make_plan(n, WorldSpec(P), Strategy(assignment="chunk", chunk=g), 3, 0, B)
    owner = {}
    for r in range(P):
        ids, _ = plan.rank_samples(r)
        for grp in set((ids // g).tolist()):
            owner.setdefault(grp, set()).add(r)
    assert sum(len(v) > 1 for v in owner.values()) <= P  # only groups at column edges


def test_circular_wraps_like_caffe():
    plan = make_plan(10, 2, Strategy(circular=True), batch_size=4)
    assert plan.num_steps == 3 and plan.total == 12
    assert plan.order().tolist() == [*list(range(10)), 0, 1]
    with pytest.raises(ConfigError):
        make_plan(10, 2, Strategy(circular=True), batch_size=4, drop_last=True)


# ------------------------------------------------------------------- resume


@pytest.mark.parametrize(
    "strategy", ASSIGNMENT_STRATEGIES, ids=lambda s: f"{s.assignment}-{s.chunk_layout}-{s.region}"
)
@given(job=jobs(max_n=200), P2=st.integers(1, 64), data=st.data())
@settings(max_examples=25)
def test_resume_at_another_world_size_delivers_exactly_the_rest(strategy, job, P2, data):
    n, world, B, drop = job
    plan = make_plan(n, world, strategy, 7, 3, B, drop)
    step = data.draw(st.integers(0, plan.num_steps))
    done = [i for s in range(step) for r in range(world.size) for i in plan.samples(r, s)]
    new = plan.resume(step, WorldSpec(P2, data.draw(st.integers(1, P2))))
    rest = [i for s in range(step, new.num_steps) for r in range(P2) for i in new.samples(r, s)]
    assert new.num_steps == plan.num_steps
    assert sorted(done + rest) == sorted(plan.order().tolist())
    assert rest == plan.samples_after(step).tolist()
    # resuming twice (A -> B -> C) still delivers the same remainder
    if step < new.num_steps:
        again = new.resume(step + 1, WorldSpec(3))
        tail = [
            i
            for s in range(step + 1, again.num_steps)
            for r in range(3)
            for i in again.samples(r, s)
        ]
        assert tail == plan.samples_after(step + 1).tolist()
    with pytest.raises(StateError):
        plan.resume(plan.num_steps + 1)


# -------------------------------------------------------------------- reads


def _check_reads(plan, records_bytes):
    """Reads deliver each step's samples exactly where the consumer expects them."""
    s = plan.strategy
    per_window: dict[tuple[int, int], int] = {}
    got = []
    for reader in plan.readers:
        node = plan.world.node_of(reader)
        for op in plan.reads(reader):
            buf = (
                np.concatenate(
                    [
                        records_bytes[o : o + ln]
                        for o, ln in zip(op.offsets, op.lengths, strict=True)
                    ]
                )
                if op.num_reads
                else np.zeros(0, np.uint8)
            )
            assert buf.size == op.nbytes
            key = (node if s.aggregated else reader, op.round)
            per_window[key] = per_window.get(key, 0) + op.nbytes
            for i, step, slot, src, size in zip(
                op.ids, op.step, op.slot, op.src, op.size, strict=True
            ):
                assert step in op.steps
                unit = plan.node_samples(node, step) if s.aggregated else plan.samples(reader, step)
                assert unit[slot] == i
                _fid, off, ln = plan.records.extents(np.array([i]))
                assert np.array_equal(buf[src : src + size], records_bytes[off[0] : off[0] + ln[0]])
                got.append((int(step), int(i)))
            if s.sample_reads:
                assert op.num_reads == len(op.ids)
    from feedline.plan.reads import window_cap

    assert max(per_window.values(), default=0) <= window_cap(plan) <= plan.memory_cap // 2
    expect = sorted(
        (st_, int(i))
        for st_ in range(plan.num_steps)
        for i in plan.ids_at(
            np.arange(st_ * plan.batch_size, st_ * plan.batch_size + plan.step_len(st_))
        )
    )
    assert sorted(got) == expect
    return got


@pytest.mark.parametrize("preset", sorted(PRESETS))
@given(job=jobs(max_n=120), size=st.integers(1, 40), cap_steps=st.integers(2, 40))
@settings(max_examples=8)
def test_reads_cover_every_step_under_the_cap(preset, job, size, cap_steps):
    n, world, B, drop = job
    strategy = get_strategy(
        preset, coalesce_bytes=PRESETS[preset].coalesce_bytes and 200, coalesce_gap=7
    )
    # per sample: its bytes, and the shared plan node sources keep beside aggregated reads
    per_sample = size + (PLAN_BYTES_PER_SAMPLE if strategy.aggregated else 0)
    cap = 2 * cap_steps * per_sample * (-(-B // world.size)) * (-(-world.size // world.nodes))
    records = FlatRecords(n, size, header=5)
    plan = make_plan(records, world, strategy, 1, 2, B, drop, memory_cap=cap)
    data = np.random.default_rng(0).integers(0, 256, 5 + n * size, dtype=np.uint8)
    _check_reads(plan, data)


@given(job=jobs(max_n=150), data=st.data())
@settings(max_examples=20)
def test_coalesced_and_staggered_plans_deliver_the_same_samples(job, data):
    n, world, B, drop = job
    lengths = np.array(
        data.draw(st.lists(st.integers(1, 30), min_size=n, max_size=n)), dtype=np.int64
    )
    gaps = np.array(data.draw(st.lists(st.integers(0, 9), min_size=n, max_size=n)), dtype=np.int64)
    offsets = np.cumsum(gaps + lengths) - lengths
    rec = IndexRecords(np.zeros(n, np.int32), offsets, lengths)
    blob = np.random.default_rng(1).integers(
        0, 256, int((offsets + lengths).max(initial=0)), dtype=np.uint8
    )
    base = data.draw(st.sampled_from(["lmm-dio-prov", "contiguous", "tf", "async-db", "feedline"]))
    cap = (
        4
        * (30 + PLAN_BYTES_PER_SAMPLE)  # longest record and the node sources' shared plan
        * (-(-B // world.size))
        * (-(-world.size // world.nodes))
        * data.draw(st.integers(1, 8))
    )
    plain = make_plan(
        rec, world, get_strategy(base, coalesce_bytes=0, stagger=0), 4, 1, B, drop, memory_cap=cap
    )
    fancy = make_plan(
        rec,
        world,
        get_strategy(base, coalesce_bytes=64, coalesce_gap=5, stagger=2),
        4,
        1,
        B,
        drop,
        memory_cap=cap,
    )
    assert sorted(_check_reads(plain, blob)) == sorted(_check_reads(fancy, blob))
    # token rounds line up: every reader has one operation per window
    assert len({len(fancy.reads(r)) for r in fancy.readers}) == 1


def test_coalescing_makes_fewer_larger_reads():
    # one node: under strided order a node's steps are adjacent in the file
    rec = FlatRecords(4096, 3072)
    world = WorldSpec(16, 1)
    plain = make_plan(rec, world, "lmm-dio-prov", batch_size=256, memory_cap=1 << 30)
    coal = make_plan(rec, world, "lmm-dio-prov-coal", batch_size=256, memory_cap=1 << 30)
    r = plain.readers[0]
    a, b = plain.reads(r), coal.reads(r)
    assert sum(op.nbytes for op in a) == sum(op.nbytes for op in b)
    assert sum(op.num_reads for op in b) < sum(op.num_reads for op in a)
    assert max(op.nbytes for op in b) >= 8 << 20 or len(b) == 1
    assert len(b[0].steps) > 1
    small = make_plan(rec, world, "lmm-dio-prov-coal", batch_size=256, memory_cap=4 << 20)
    assert max(op.nbytes for op in small.reads(r)) <= (4 << 20) // 2


def test_memory_cap_too_small_is_rejected_with_advice():
    with pytest.raises(ConfigError, match="raise memory_cap"):
        make_plan(FlatRecords(100, 1000), 4, "lmm", batch_size=64, memory_cap=1000).reads(0)


def test_stagger_tokens_form_rings():
    plan = make_plan(
        FlatRecords(1000, 10),
        WorldSpec(40, 10),
        get_strategy("lmm-dio-prov-coal-stag", stagger=3),
        batch_size=40,
    )
    readers = plan.readers
    assert len(readers) == 10
    infos = {r: plan.stagger(r) for r in readers}
    for r, info in infos.items():
        assert info.enabled and info.size == 3 and info.groups == 4
        assert infos[info.send_to].recv_from == r
        assert infos[info.send_to].label == info.label
    # at most n readers start, one per label
    assert sorted(i.label for i in infos.values() if i.starts) == [0, 1, 2]
    off = make_plan(FlatRecords(1000, 10), WorldSpec(40, 10), "lmm-dio-prov-coal", batch_size=40)
    assert not off.stagger(readers[0]).enabled


def test_presets_and_overrides():
    for name, s in PRESETS.items():
        assert get_strategy(name) == s
        assert Strategy.from_dict(s.to_dict()) == s
    assert get_strategy("lmm", readers_per_node=2).readers_per_node == 2
    assert get_strategy("global").assignment == "global"
    with pytest.raises(ConfigError):
        get_strategy("nope")
    with pytest.raises(ConfigError):
        get_strategy("lmm", warp_speed=True)
    assert Strategy(readers_per_node=None).readers_for(16) == 1
    assert Strategy(readers_per_node=None).readers_for(36) == 2


def test_chunk_column_reads_whole_groups():
    # windows are whole groups per column: no group is read twice, nothing read for nothing
    n, B, P, g, size = 5000, 32, 4, 8, 10
    s = Strategy(assignment="chunk", chunk=g, readers_per_node=1)
    plan = make_plan(FlatRecords(n, size), WorldSpec(P, 2), s, 9, 0, B, memory_cap=1 << 24)
    from feedline.plan.reads import window_steps

    assert window_steps(plan) % g == 0
    ops = [op for r in plan.readers for op in plan.reads(r)]
    assert sum(op.nbytes for op in ops) == sum(op.payload for op in ops) == n * size
    # at most one extent per group (plus the short groups of the column ends)
    assert sum(op.num_reads for op in ops) <= n // g + B
