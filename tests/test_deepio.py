# SPDX-License-Identifier: Apache-2.0
"""DeepIO beyond the store's mechanics: the opportunistic order, its RL, the store as a
cost-model candidate, and the portable API (§III-C, §III-D)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from feedline import ConfigError
from feedline.plan import FlatRecords, WorldSpec, get_strategy, make_plan
from feedline.plan.cost import PROFILES, estimate, shape_of
from feedline.plan.rl import ramp_floor, randomization_level, rl_memory, round_cuts
from feedline.plan.store_cost import (
    EPOCH_HORIZON,
    FABRIC,
    LOAD_UNIT_BYTES,
    MAX_LOAD_ROUNDS,
    load_rounds_for,
    store_bounce_per_node,
    store_candidate,
    store_estimate,
)
from feedline.sources.store import _Rounds, _share


def _plans(n, P, M, R, B, seed=4, epoch=1):
    kw = {"memory_fraction": R}
    rec = FlatRecords(n, 100)
    opp = make_plan(
        rec, WorldSpec(P, M), get_strategy("deepio-opportunistic", **kw), seed, epoch, B
    )
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
    assert all(a > b for a, b in itertools.pairwise(vals))  # lower with more ranks
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
    # R = 1, 78 MB per rank: loaded progressively, in K rounds of random 512 KiB units
    # (load_rounds_for): the first batch waits for one round, the others overlap, each
    # load counted once; the first epoch's order is memory(1/K)'s, its RL above the floor
    K, g = load_rounds_for(sh, 0.9)
    assert K == MAX_LOAD_ROUNDS and g == -(-LOAD_UNIT_BYTES // 3072)
    assert first.figures["load_rounds"] == K and first.knobs["load_rounds"] == K
    # the rounds ramp up (round_cuts): the first is a fraction of a full round
    units = -(-204_800 // g)
    cuts = round_cuts(units, round(units / K), ramp_floor(256, g))
    assert first.knobs["chunk"] == g and first.windows_per_unit == len(cuts) - 1 > K
    assert not first.rejected and first.terms["first_window"] > 0 and first.bytes > 0
    bounce = store_bounce_per_node(sh)  # 2 ranks a node, 4 threads each, 1 MiB + 4 KiB
    assert bounce == 2 * 4 * ((1 << 20) + 4096)
    touch = (first.memory_per_node - bounce) * 4 / 8 / FABRIC.touch_bw
    rest = first.terms["latency"] + first.terms["transfer"]
    share = (cuts[1] - cuts[0]) / units
    assert share < 1 / K / 2
    assert rest == pytest.approx((1 / share - 1) * (first.terms["first_window"] - touch))
    assert later.terms["first_window"] == later.terms["transfer"] == 0 == later.bytes  # in memory
    # too small to cut (1 MiB per rank): one load, the whole of it before the first batch
    tiny = shape_of(FlatRecords(2_048, 3072), WorldSpec(8, 4), 256, 2_500_000_000)
    assert load_rounds_for(tiny, 0.9) == (0, 0)
    one = store_estimate(tiny, prof, 1.0, epoch=0)
    assert one.terms["transfer"] == one.terms["latency"] == 0 < one.terms["first_window"]
    assert one.rl == pytest.approx(1.0) and one.knobs["load_rounds"] == 0
    # R < 1 reloads every epoch: round 1 exposed, round 2 overlapped
    assert half.terms["transfer"] > 0 and half.windows_per_unit == 2
    overlapped = half.terms["latency"] + half.terms["transfer"]
    assert overlapped == pytest.approx(half.terms["first_window"], rel=1e-9)
    # 2R = 1, + 2%; a progressive R = 1 keeps its K slots, + 2%
    assert half.memory_per_node == pytest.approx(later.memory_per_node)
    assert later.memory_per_node == pytest.approx(1.02 * sh.n * sh.mean_len * sh.span / 4 + bounce)
    assert opp.figures["remote_gets"] == 0 < later.figures["remote_gets"]
    assert opp.terms["serve"] < later.terms["serve"]
    assert (
        opp.rl < later.rl == pytest.approx(rl_memory(sh.n, 1 / K, unit=g, ramp=ramp_floor(256, g)))
    )
    assert later.rl > 0.9
    # the first epoch pays the load on top of what every epoch pays; comparable with a
    # window candidate's estimate (same Estimate, same term names)
    load = first.terms["first_window"] + rest
    assert first.cost == pytest.approx(later.cost + load + first.terms["coordination"])
    # the candidate the chooser compares: its mean cost over EPOCH_HORIZON epochs
    cand = store_candidate(sh, prof, 1.0)
    H = EPOCH_HORIZON
    assert cand.cost == pytest.approx((first.cost + (H - 1) * later.cost) / H)
    assert cand.figures["first_epoch_s"] == pytest.approx(first.cost)
    assert cand.figures["later_epoch_s"] == pytest.approx(later.cost)
    assert cand.requests == first.requests and cand.bytes == first.bytes  # the load
    window = estimate(sh, prof, "rank", 8 << 20, 0)
    assert set(window.terms) <= set(later.terms) and window.cost > 0
    small_cap = shape_of(rec, WorldSpec(8, 4), 256, 20_000_000)  # with 8 MiB of bounce
    assert "memory cap" in store_estimate(small_cap, prof, 1.0).rejected
    assert not store_estimate(small_cap, prof, 0.02).rejected


# ------------------------------------------------------- the store in the cost model


def _choice(n, P, M, cap, profile, **kw):
    from feedline.plan.cost import choose
    from feedline.plan.lmdb_model import LmdbModel

    return choose(
        LmdbModel(n, 3072), WorldSpec(P, M), 2 * P if n > 10**6 else 1024, cap, profile, **kw
    )


@pytest.mark.parametrize(
    ("P", "M", "profile"),
    [(4, 1, "local"), (1, 1, "parallel"), (4, 1, "parallel"), (4, 2, "parallel")],
)  # fmt: skip
def test_chooser_takes_the_store_when_it_fits_and_pays(P, M, profile):
    """50,000 x 3 KB (200 MB on disk) under a 2 GB cap: the store's first epoch costs
    about what a window epoch does (both read the file once) and its later epochs only
    copy from memory, so over EPOCH_HORIZON epochs it wins, and says so."""
    c = _choice(50_000, P, M, 2_000_000_000, profile)
    assert c.best.unit == "store" and c.strategy.store == "ordered"
    assert c.strategy.assignment == "memory" and c.strategy.memory_fraction == 1.0
    assert not c.strategy.auto and c.strategy.readers_per_node == 0
    f = c.best.figures
    # 293 units of 512 KiB, under MIN_LOAD_UNITS: loaded at once, not progressively
    assert c.strategy.load_rounds == 0 and f["load_rounds"] == 0
    assert f["later_epoch_s"] < f["first_epoch_s"] and c.best.rl == pytest.approx(1.0)
    win = c.runner_up
    assert win is not None and win.unit != "store" and c.best.cost < win.cost
    text = c.explain()
    assert "DeepIO store, R=1: epoch 1" in text and "-> won:" in text
    assert "chosen: DeepIO store (ordered, R=1)" in text
    again = _choice(50_000, P, M, 2_000_000_000, profile)  # pure: every rank agrees
    assert again.strategy == c.strategy and again.best.cost == c.best.cost


def test_chooser_leaves_the_store_out_when_it_does_not_fit_or_pay_or_run():
    # over the cap: rejected, a window plan chosen, and explain says why
    c = _choice(50_000, 4, 2, 40_000_000, "local")
    assert (
        c.best.unit != "store" and c.strategy.store == "auto" and c.strategy.assignment == "window"
    )
    stores = [x for x in c.candidates if x.unit == "store"]
    assert len(stores) == 2 and all(x.rejected.startswith("memory cap") for x in stores)
    assert "DeepIO store, R=1: rejected (memory cap" in c.explain()
    # R = 0.25 fits where R = 1 does not; on the tmpfs profile reading is as cheap as
    # serving, and the store's R = 0.25 rereads its rounds every epoch: it loses
    c = _choice(50_000, 4, 2, 80_000_000, "memory")
    r1, r25 = (x for x in c.candidates if x.unit == "store")
    assert r1.rejected and not r25.rejected and c.best.unit != "store"
    assert "-> lost: " in c.explain()
    # 206 GB over 128 nodes fits (1.5 GiB a node) but every rank loading it at once
    # contends at the parallel file system: the load costs more than the window plan
    # saves over the horizon (issue 13's shape: the choice is unchanged)
    c = _choice(50_000_000, 4608, 128, 2_500_000_000, "parallel")
    st = next(x for x in c.candidates if x.unit == "store" and not x.rejected)
    assert c.best.unit == "node" and st.cost > c.best.cost
    assert st.figures["later_epoch_s"] < c.best.cost / 2  # later epochs are cheap, but
    assert st.figures["first_epoch_s"] > 10 * c.best.cost  # the load does not pay back
    # one process on a local disk: its first epoch also faults in 200 MB of fresh memory
    # (Fabric.touch_bw), which 3 epochs of copies instead of local reads do not pay back
    c = _choice(50_000, 1, 1, 2_000_000_000, "local")
    st = next(x for x in c.candidates if x.unit == "store" and not x.rejected)
    assert c.best.unit == "rank" and st.cost > c.best.cost
    assert st.figures["first_epoch_s"] > 2 * c.best.cost > 2 * st.figures["later_epoch_s"]
    # 64 ranks on 8 nodes with local disks: 8 disks read the 200 MB faster than the
    # store's 50,000 remote gets per epoch serve it
    c = _choice(50_000, 64, 8, 2_000_000_000, "local")
    st = next(x for x in c.candidates if x.unit == "store" and not x.rejected)
    assert c.best.unit == "rank" and st.figures["later_epoch_s"] > c.best.cost
    # off, or not available here: not a candidate, and explain says why
    base = get_strategy("feedline", store="off")
    c = _choice(50_000, 4, 2, 2_000_000_000, "local", base=base)
    assert c.best.unit != "store" and not [x for x in c.candidates if x.unit == "store"]
    assert "DeepIO store: not a candidate (store='off')" in c.explain()
    c = _choice(50_000, 4, 2, 2_000_000_000, "local", store="it needs an MPI world")
    assert c.best.unit != "store" and c.store_off == "it needs an MPI world"
    # store="ordered"/"opportunistic" on the feedline preset: only R is chosen
    c = _choice(
        50_000, 4, 2, 80_000_000, "local", base=get_strategy("feedline", store="opportunistic")
    )
    assert c.strategy.store == "opportunistic" and c.strategy.memory_fraction == 0.25
    with pytest.raises(ConfigError, match="cannot run here"):
        _choice(
            50_000,
            4,
            2,
            2_000_000_000,
            "local",
            base=get_strategy("feedline", store="ordered"),
            store="no MPI",
        )


# ------------------------------------------------------------------ portable API


@pytest.fixture(scope="module")
def cifar(tmp_path_factory):
    from feedline_tools.make import generate

    return generate(
        "cifar10-large", str(tmp_path_factory.mktemp("api") / "c"), samples=300, progress=False
    )


def test_seeds_and_shuffle_rand_are_the_loaders_order(cifar, tmp_path):
    from feedline import ConfigError, Loader, StateError, deepio, open_dataset

    seeds = deepio.generate_seed(3, tmp_path / "s.json", seed=7)
    assert seeds == deepio.generate_seed(3, tmp_path / "t.json", seed=7) and len(set(seeds)) == 3
    ds = open_dataset(cifar)
    for epoch in range(3):
        ids = deepio.shuffle_rand(epoch, 0, tmp_path / "s.json", n=len(ds), batch_size=64)
        with Loader(ds, 64, preset="deepio-ordered", seed=seeds[epoch], decode=False) as ld:
            ld.set_epoch(epoch)
            assert np.array_equal(np.concatenate([b.ids for b in ld]), ids)
    for mode in ("ordered", "opportunistic"):
        parts = [
            deepio.shuffle_rand(
                1,
                w,
                tmp_path / "s.json",
                n=300,
                workers=4,
                batch_size=64,
                memory_fraction=0.5,
                mode=mode,
                nodes=2,
            )
            for w in range(4)
        ]
        assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(300))
    with pytest.raises(ConfigError, match="epoch 3"):
        deepio.shuffle_rand(3, 0, tmp_path / "s.json", n=300)
    (tmp_path / "bad.json").write_text('{"format": "x"}')
    with pytest.raises(StateError, match=r"bad\.json"):
        deepio.shuffle_rand(0, 0, tmp_path / "bad.json", n=300)


@pytest.mark.parametrize("backend", ["files", "native"])
def test_batch_reads_what_the_dataset_holds(cifar, tmp_path, backend):
    from feedline import ConfigError, CorruptDataError, deepio, open_dataset

    ds = open_dataset(cifar)
    ids = np.random.default_rng(1).permutation(len(ds))
    got = list(deepio.batch(ids, 32, count_per_read=7, dataset=ds, backend=backend))
    assert len(got) == 10 and len(got[-1].ids) == 300 - 9 * 32
    for mb in got:
        want, _ = ds.read_many(mb.ids)
        assert mb.data.tobytes() == want.tobytes()
        assert mb.data.shape == (len(mb.ids), ds.index.fixed_length)
    # the paper's layout: fixed-size elements back to back in a list of files
    rng = np.random.default_rng(2)
    blobs = [rng.integers(0, 256, 100 * k + 37, dtype=np.uint8) for k in (3, 5)]
    files = []
    for i, b in enumerate(blobs):
        (tmp_path / f"f{i}").write_bytes(b.tobytes())
        files.append(str(tmp_path / f"f{i}"))
    elems = np.concatenate([b[: len(b) // 100 * 100].reshape(-1, 100) for b in blobs])
    order = np.array([7, 0, 3, 2, 5, 1, 6, 4])
    mbs = list(deepio.batch(order, 3, 100, 2, files, backend=backend))
    assert np.array_equal(np.concatenate([m.data for m in mbs]), elems[order])
    with pytest.raises(ConfigError, match="outside"):
        deepio.batch([8], 1, 100, 1, files)
    # a file truncated after the layout was taken: a typed error naming it
    late = deepio.batch([7], 1, 100, 1, files, backend=backend)
    (tmp_path / "f1").write_bytes(blobs[1][:250].tobytes())
    with pytest.raises(CorruptDataError, match="f1"):
        list(late)


def test_example_trains_with_the_portable_api(tmp_path):
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("torch")
    ex = os.path.join(os.path.dirname(__file__), "..", "examples", "train_deepio_api.py")
    log = tmp_path / "ids"
    p = subprocess.run(
        [
            sys.executable,
            ex,
            "--data",
            str(tmp_path / "c"),
            "--samples",
            "200",
            "--batch",
            "32",
            "--epochs",
            "2",
            "--backend",
            "files",
            "--log",
            str(log),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    assert "epoch 1: loss" in p.stdout
    rows = [json.loads(x) for x in (tmp_path / "ids.0").read_text().splitlines()]
    for e in (0, 1):
        assert sorted(i for r in rows if r["epoch"] == e for i in r["ids"]) == list(range(200))


@pytest.mark.parametrize("R", [1.0, 0.25])
def test_plan_stats_of_a_store_plan_are_its_loads(R):
    """``feedline plan`` figures of a store plan: each rank's shares, merged across
    LMDB's holes as the store loads them (not one read per sample), the same bytes the
    store's slots are sized from."""
    from feedline.plan.lmdb_model import LmdbModel
    from feedline.plan.stats import plan_stats, store_load
    from feedline.sources.store_plan import STORE_GAP, _Rounds, share_bytes

    rec = LmdbModel(5_000, 3072)
    plan = make_plan(
        rec, WorldSpec(4, 2), get_strategy("deepio-ordered", memory_fraction=R), 1, 0, 64
    )
    st = plan_stats(plan, "x")
    payload = 5_000 * 3072
    assert st["payload_bytes_total"] == pytest.approx(payload)
    assert st["ops_per_reader"] <= (2 if R == 1 else 5_000 / 64 / 4 + 4)  # not 1,250
    assert 1.2 * payload < st["bytes_per_reader"] * 4 < 1.4 * payload  # holes read through
    fid, off, ln = (np.asarray(a, dtype=np.int64) for a in rec.extents(np.arange(5_000)))
    rounds = _Rounds(plan)
    for k in range(4):
        got = sum(
            int(share_bytes(fid, off, ln, rounds.ids(r), 4, STORE_GAP)[k])
            for r in range(rounds.count)
        )
        assert int(store_load(plan, k)[0].sum()) == got


@pytest.mark.parametrize(
    ("n", "size", "P", "M"),
    [(100_000, 3072, 8, 4), (4_096, 98_304, 4, 1), (20_480, 19_660, 4, 1)],
)
def test_progressive_first_epoch_shuffles_class_sorted_data(n, size, P, M):
    """The store's progressive epoch 0 (memory(1/K) with the model's K and unit) on
    class-sorted data (10 classes, label = id x 10 // n), batch 256: >= 9 classes per
    batch on average and |rank correlation with the disk order| <= 0.1 (the default
    preset's shuffle bar), over several seeds. A dataset of fewer units loads at once
    (its rounds' order would correlate with the disk's)."""
    from feedline.plan.store_cost import MIN_LOAD_UNITS

    few = shape_of(FlatRecords(50_000, 3072), WorldSpec(4, 1), 256, 2_500_000_000)
    assert load_rounds_for(few, 0.9) == (0, 0)  # 293 units of 512 KiB
    rec = FlatRecords(n, size)
    sh = shape_of(rec, WorldSpec(P, M), 256, 2_500_000_000)
    K, g = load_rounds_for(sh, 0.9)
    assert K > 1 and -(-n // g) >= MIN_LOAD_UNITS
    for seed in range(5):
        st = get_strategy("deepio-ordered", load_rounds=K, chunk=g)
        order = make_plan(rec, WorldSpec(P, M), st, seed, 0, 256).order()
        assert np.array_equal(np.sort(order), np.arange(n))
        labels = order * 10 // n
        classes = [len(np.unique(labels[i : i + 256])) for i in range(0, n - 255, 256)]
        assert np.mean(classes) >= 9, (seed, np.mean(classes))
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n)  # delivery position of each id
        assert abs(np.corrcoef(np.arange(n), rank)[0, 1]) <= 0.1, seed


@pytest.mark.parametrize("units", [0, 1, 7, 44, 683, 3200, 10_000])
@pytest.mark.parametrize("per_round", [1, 3, 11, 43, 200, 20_000])
def test_round_cuts_ramp_up_to_full_rounds(units, per_round):
    """Uniform cuts are rounds of per_round units (the last short); ramped ones start at
    max(RAMP_MIN_UNITS, per_round / RAMP_FIRST) units and grow by about RAMP_GROWTH per
    round, never past per_round, and cover the same units."""
    from feedline.plan.rl import RAMP_FIRST, RAMP_GROWTH, RAMP_MIN_UNITS

    flat = round_cuts(units, per_round)
    assert flat.tolist() == sorted({*range(0, units, per_round), units})
    cuts = round_cuts(units, per_round, ramp=1)
    assert cuts[0] == 0 and cuts[-1] == units and (np.diff(cuts) > 0).all()
    sizes = np.diff(cuts)
    assert (sizes <= per_round).all() or per_round >= units
    first = max(RAMP_MIN_UNITS, -(-per_round // RAMP_FIRST))
    if first < per_round < units:
        assert sizes[0] == min(first, units)
        grow = sizes[:-1][sizes[:-1] < per_round]  # the ramp (the last round may be short)
        assert (np.diff(grow) >= 1).all() and (grow[1:] <= grow[:-1] * RAMP_GROWTH + 1).all()
        assert len(sizes) >= len(np.diff(flat)) and sizes[0] < per_round  # a small first
    else:
        assert cuts.tolist() == flat.tolist()


@pytest.mark.parametrize("preset", ["deepio-ordered", "deepio-opportunistic"])
def test_a_progressive_first_epoch_is_ramped_and_exactly_once(preset):
    """Epoch 0 of a progressive store (load_rounds K, R = 1) follows memory(1/K) with
    ramped rounds: the store's layout (layout_stream) and the plan agree on the rounds,
    each round's positions hold exactly the round's ids, and every id comes once; the
    model's RL is the ramped one."""
    from feedline.plan.assign_memory import layout_stream

    rec = FlatRecords(20_000, 100)
    st = get_strategy(preset, load_rounds=4, chunk=16)
    plan = make_plan(rec, WorldSpec(4, 2), st, 3, 0, 64)
    lay = layout_stream(20_000, plan.strategy, 3, 64)
    assert lay is not None and lay.rounds > 4
    assert lay.cuts.tolist() == round_cuts(1250, round(1250 / 4), ramp_floor(64, 16)).tolist()
    rounds = _Rounds(plan)
    assert rounds.progressive and rounds.count == lay.rounds
    order = plan.order()
    assert np.array_equal(np.sort(order), np.arange(20_000))
    for r in range(lay.rounds):
        lo, hi = int(rounds.lo[r]), int(rounds.hi[r])
        assert np.array_equal(np.sort(order[lo:hi]), lay.round_ids(r)), r
    assert rounds.hi[0] - rounds.lo[0] < rounds.hi[-2] - rounds.lo[-2]
    P = 4 if preset == "deepio-opportunistic" else 1
    want = rl_memory(20_000, 1 / 4, unit=16, ranks=P, ramp=ramp_floor(64, 16))
    assert randomization_level(plan) == pytest.approx(want)
    # later epochs are uniform full permutations (R = 1)
    later = make_plan(rec, WorldSpec(4, 2), st, 3, 1, 64)
    assert later._stream.rounds == 1 and randomization_level(later) == pytest.approx(
        rl_memory(20_000, 1.0, unit=16, ranks=P)
    )


def test_the_ramp_holds_the_first_global_batch_and_only_a_progressive_epoch_0_ramps():
    """A global batch larger than the ramp's first round widens it: the first step needs
    round 0 alone (4,096 CosmoFlow-sized records in units of 6, K = 16, global batch 256).
    load_rounds with R < 1 does nothing: every epoch's rounds are uniform."""
    rec = FlatRecords(4096, 10)
    st = get_strategy("deepio-ordered", load_rounds=16, chunk=6)
    for B in (16, 128, 256):  # 683 units, full rounds of 43: first 16, 23, then 43 units
        plan = make_plan(rec, WorldSpec(4, 1), st, 0, 0, B)
        rounds = _Rounds(plan)
        assert rounds.progressive and int(rounds.step_max[0]) == 0, B
        assert int(rounds.hi[0] - rounds.lo[0]) >= B
        assert np.diff(plan._stream.cuts)[0] == min(43, max(16, ramp_floor(B, 6)))
    # a batch of a full round or more: no ramp (uniform rounds, as before)
    for B in (256, 1024):
        plan = make_plan(rec, WorldSpec(4, 1), st, 0, 0, B)
        assert np.diff(plan._stream.cuts)[:-1].tolist() == [43] * 15
    quarter = get_strategy("deepio-ordered", memory_fraction=0.25, load_rounds=4, chunk=16)
    for epoch in (0, 3):
        p = make_plan(FlatRecords(20_000, 10), WorldSpec(2, 1), quarter, 1, epoch, 64)
        sizes = np.diff(p._stream.cuts)
        assert len(sizes) >= 4 and (sizes[:-1] == p._stream.per_round).all(), epoch
