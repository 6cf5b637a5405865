# SPDX-License-Identifier: Apache-2.0
"""DeepIO beyond the store's mechanics: the opportunistic order, its RL, the store as a
cost-model candidate, and the portable API (§III-C, §III-D)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from feedline.plan import FlatRecords, WorldSpec, get_strategy, make_plan
from feedline.plan.cost import PROFILES, estimate, shape_of
from feedline.plan.rl import randomization_level, rl_memory
from feedline.plan.store_cost import store_estimate
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
