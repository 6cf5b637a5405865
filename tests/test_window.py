# SPDX-License-Identifier: Apache-2.0
"""The window assignment and the cost model behind the ``feedline`` preset
(``feedline/plan/assign_window.py``, ``feedline/plan/cost.py``, docs/planner.md)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedline import Loader
from feedline.errors import ConfigError
from feedline.plan import FlatRecords, WorldSpec, get_strategy, make_plan
from feedline.plan.cost import PROFILES, StorageProfile, choose, get_profile
from feedline.plan.lmdb_model import LmdbModel
from feedline.plan.stats import plan_stats

MiB = 1 << 20


def window(region: str, tile: int, w: int):
    return get_strategy(
        "feedline",
        auto=False,
        region=region,
        readers_per_node=1 if region == "node" else 0,
        chunk=tile,
        window_steps=w,
    )


@given(
    P=st.integers(1, 12),
    data=st.data(),
)
@settings(max_examples=40, deadline=None)
def test_window_plans_are_exactly_once_and_resume_anywhere(P, data):
    M = data.draw(st.integers(1, P))
    n = data.draw(st.integers(0, 500))
    B = data.draw(st.integers(1, 40))
    region = data.draw(st.sampled_from(["rank", "node"]))
    s = window(region, data.draw(st.integers(1, 50)), data.draw(st.integers(1, 9)))
    rec = FlatRecords(n, 100)
    plan = make_plan(rec, WorldSpec(P, M), s, 7, 2, B, memory_cap=1 << 30)
    assert np.array_equal(np.sort(plan.order()), np.arange(n))
    got = np.concatenate([op.ids for r in plan.readers for op in plan.reads(r)] or [[]])
    assert np.array_equal(np.sort(got), np.arange(n))
    if plan.num_steps:
        k = data.draw(st.integers(0, plan.num_steps))
        P2 = data.draw(st.integers(1, 12))
        rest = plan.resume(k, WorldSpec(P2, data.draw(st.integers(1, P2))))
        done = plan.order()[: k * B]
        assert np.array_equal(np.sort(np.concatenate([done, rest.order()])), np.arange(n))


def test_a_window_is_read_as_its_tiles():
    rec = FlatRecords(10_000, 1000)
    plan = make_plan(rec, WorldSpec(1), window("rank", 100, 10), 0, 0, 100, memory_cap=1 << 30)
    ops = plan.reads(0)
    # 100 steps, 10 per window; the first 10 cut into 1, 1, 3 and 5 steps
    assert [len(op.steps) for op in ops] == [1, 1, 3, 5] + [10] * 9
    for op in ops:
        # 100 samples per step, tiles of 100 records: at most one piece more than steps
        assert len(op.offsets) <= len(op.steps) + 1
        assert op.nbytes == op.payload == 100_000 * len(op.steps)


@pytest.mark.parametrize(("w", "steps"), [(1, 5), (2, 9), (3, 3), (10, 100), (16, 7), (64, 1000)])
def test_the_first_window_is_cut_finer(w, steps):
    """Windows of w steps, the first w cut into w/8, w/8, w/4, w/2: less is read before
    the first batch; every window is still shuffled completely, and only within itself."""
    from feedline.plan.assign_window import window_bounds, window_sizes

    b = window_bounds(w, steps)
    sizes = window_sizes(w, steps)
    assert b[0] == 0 and sizes.sum() == steps and (sizes >= 1).all()
    assert sizes[0] == min(max(1, w >> 3), steps)
    assert set(range(w, steps, w)) <= set(b.tolist())  # later windows: as before
    B = 12
    rec = FlatRecords(B * steps, 100)
    plan = make_plan(rec, WorldSpec(3), window("rank", 4, w), 7, 0, B, memory_cap=1 << 30)
    order = plan.order()
    assert np.array_equal(np.sort(order), np.arange(B * steps))
    for r in range(3):  # rank r's samples of a window come from that window's tiles only
        ops = plan.reads(r)
        assert [len(op.steps) for op in ops] == [
            len(range(a, z)) for a, z in zip(b, np.append(b[1:], steps), strict=True)
        ]
        for op in ops:
            read = np.concatenate(
                [
                    np.arange(o // 100, (o + n) // 100)
                    for o, n in zip(op.offsets, op.lengths, strict=True)
                ]
            )
            assert set(op.ids.tolist()) <= set(read.tolist())


@pytest.mark.parametrize(("ranks", "nodes"), [(64, 8), (512, 32), (4608, 128), (9216, 256)])
def test_feedline_at_the_papers_scale_is_coalesced_and_shuffled(ranks, nodes):
    """The default preset's issue-13 criteria, planned for the parallel profile."""
    rec = LmdbModel(50_000_000, 3072)
    rows = {}
    for name in ("feedline", "lmm-dio-prov-coal"):
        plan = make_plan(rec, WorldSpec(ranks, nodes), name, 0, 0, 2 * ranks)
        rows[name] = plan_stats(plan, name)
    f, c = rows["feedline"], rows["lmm-dio-prov-coal"]
    req_f = f["ops_per_reader"] * f["readers"]
    req_c = c["ops_per_reader"] * c["readers"]
    assert req_f <= 2 * req_c, (req_f, req_c)
    assert f["bytes_per_reader"] / f["ops_per_reader"] >= 4 * MiB
    assert f["redundant_bytes_total"] <= 0.3 * rec.file_bytes
    assert f["rl"] >= 0.9


def test_the_chooser_reads_per_node_at_scale_and_explains():
    rec = LmdbModel(50_000_000, 3072)
    ch = choose(rec, WorldSpec(9216, 256), 18432, 2_500_000_000, "parallel")
    assert ch.strategy.region == "node" and ch.strategy.readers_per_node == 1
    assert not ch.strategy.auto and ch.strategy.window_steps > 0 and ch.strategy.chunk > 0
    text = ch.explain()
    assert "chosen:" in text and "latency" in text and "1 reader/node" in text
    # without shared memory (no MPI) only per-rank reading is a candidate
    alone = choose(rec, WorldSpec(9216, 256), 18432, 2_500_000_000, "parallel", aggregate=False)
    assert alone.strategy.region == "rank"
    # more latency favours fewer, larger reads
    slow = StorageProfile("slow", 50e-3, 1e9, 10e9, 100e9, 8, 1024)
    ch_slow = choose(rec, WorldSpec(512, 32), 1024, 2_500_000_000, slow)
    ch_fast = choose(rec, WorldSpec(512, 32), 1024, 2_500_000_000, PROFILES["memory"])
    assert ch_slow.best.requests <= ch_fast.best.requests
    # the profile line names what the model charges: sub-GB/s aggregates, seeks
    emu = dataclasses.replace(slow, aggregate_bw=0.5e9, seek_s=4e-3)
    text = choose(rec, WorldSpec(512, 32), 1024, 2_500_000_000, emu).explain()
    assert "aggregate 0.5 GB/s, seek 4.00 ms" in text


def test_contention_collapse_and_queue():
    """``collapse`` (a real parallel file system's default) charges streams beyond
    ``server_streams`` as lost bandwidth, which keeps node readers at scale; ``queue``
    (the emulator's servers) charges only the slots' seek time, so per-rank readers
    are not penalised for their number."""
    from feedline.plan.cost import contention_factor, estimate, server_busy_s, shape_of

    base = dict(
        name="p",
        latency_s=3e-4,
        stream_bw=0.8e9,
        node_bw=1e9,
        aggregate_bw=2e9,
        streams_per_node=16,
        server_streams=16,
        seek_s=1e-3,
    )
    collapse = StorageProfile(**base)
    queue = StorageProfile(**base, contention="queue")
    assert collapse.contention == "collapse"
    assert contention_factor(collapse, 32) == 2.0 and contention_factor(collapse, 8) == 1.0
    assert contention_factor(queue, 32) == 1.0
    assert server_busy_s(collapse, 1000, 1e9) == 0.0
    # 1,000 seeks of 1 ms and 1 GB at 0.8 GB/s over 16 slots
    assert server_busy_s(queue, 1000, 1e9) == pytest.approx((1.0 + 1.25) / 16)
    sh = shape_of(LmdbModel(200_000, 3072), WorldSpec(8, 4), 2048, 625_000_000)
    r_c = estimate(sh, collapse, "rank", MiB, 32)
    r_q = estimate(sh, queue, "rank", MiB, 32)
    assert r_c.terms["transfer"] == pytest.approx(2 * r_q.terms["transfer"])
    # a queueing storage whose seeks dominate still bounds the transfer
    seeky = StorageProfile(**{**base, "seek_s": 0.5}, contention="queue")
    r_s = estimate(sh, seeky, "rank", MiB, 32)
    assert r_s.terms["transfer"] == pytest.approx(server_busy_s(seeky, r_s.requests, sh.file_bytes))
    assert r_s.terms["transfer"] > r_q.terms["transfer"]
    # the emulator's 8 ranks on 4 nodes: of the window plans, per-rank reads win under
    # queue, one reader per node under collapse
    rec = LmdbModel(200_000, 3072)

    def best_window(prof):
        ch = choose(rec, WorldSpec(8, 4), 2048, 625_000_000, prof)
        ok = [c for c in ch.candidates if c.unit in ("rank", "node") and not c.rejected]
        return min(ok, key=lambda c: c.cost).unit, ch.explain()

    unit, text = best_window(queue)
    assert unit == "rank" and "server slots" in text
    assert best_window(collapse)[0] == "node"


def test_small_datasets_mix_classes_at_one_rank():
    """Class-sorted data (labels = id * 10 // n), batch 256, one process."""
    for n in (20_000, 100_000):
        for prof in ("local", "parallel"):
            plan = make_plan(FlatRecords(n, 3072), 1, "feedline", 0, 0, 256, profile=prof)
            order = plan.order()
            labels = order * 10 // n
            per_batch = [len(np.unique(labels[i : i + 256])) for i in range(0, n - 255, 256)]
            assert np.mean(per_batch) >= 9, (n, prof, np.mean(per_batch))
            r = np.corrcoef(np.arange(n), order)[0, 1]  # ranks: both are permutations
            assert abs(r) <= 0.1, (n, prof, r)


def test_profiles_resolve():
    assert get_profile(None).name == "parallel"
    assert get_profile("local").name == "local"
    assert get_profile(PROFILES["memory"].to_dict()).name == "memory"
    with pytest.raises(ConfigError):
        get_profile("no-such-profile")


def test_loader_records_its_plan_and_resumes_across_choices(tmp_path):
    from feedline.dataset import open_dataset
    from feedline_tools.make import generate

    path = generate("cifar10-bin", str(tmp_path / "d"), samples=3000, progress=False)
    ds = open_dataset(path, format="records", record_bytes=3073, label_bytes=1)
    a = Loader(ds, 100, seed=1, profile="local")
    st_ = a.stats()
    assert st_["plan_profile"] == "local" and st_["plan_estimate_s"] > 0
    assert "chosen:" in a.explain()
    it = iter(a)
    seen = [next(it).ids for _ in range(7)]
    state = a.state_dict()
    a.close()
    # another memory cap and profile: the model chooses other tiles and windows
    b = Loader(ds, 100, seed=1, profile="parallel", memory_cap=4_000_000)
    assert b.strategy != a.strategy
    b.load_state_dict(state)
    rest = [x.ids for x in b]
    got = np.sort(np.concatenate(seen + rest))
    assert np.array_equal(got, np.arange(3000))
    assert len(b.stats()["epoch_s"]) == 1  # the resumed pass, measured
    b.set_epoch(1)
    it = iter(b)
    assert np.array_equal(np.sort(np.concatenate([x.ids for x in it])), np.arange(3000))
    with pytest.raises(StopIteration):
        next(it)  # asking an ended pass again does not time it again
    # every completed pass is timed once, next to the model's estimate per epoch
    times = b.stats()["epoch_s"]
    assert len(times) == 2 and all(t > 0 for t in times)
    b.close()


def test_shuffle_diagnostics():
    from feedline.plan.rl import classes_per_batch, disk_order_correlation

    n = 10_000
    assert disk_order_correlation(np.arange(n)) == pytest.approx(1.0)
    assert disk_order_correlation(np.arange(n)[::-1]) == pytest.approx(-1.0)
    assert abs(disk_order_correlation(np.random.default_rng(0).permutation(n))) < 0.05
    labels = np.arange(n) * 10 // n  # class-sorted
    assert classes_per_batch(np.arange(n), labels, 256) < 1.3  # boundaries straddled
    assert classes_per_batch(np.random.default_rng(0).permutation(n), labels, 256) > 9.8


def test_the_default_loader_mixes_a_class_sorted_lmdb_at_one_rank(tmp_path):
    """`Loader(ds, 256)` on a class-sorted LMDB, one process, what it delivers: >= 9 of 10
    classes per batch and no drift through the file, while reading large tiles."""
    from feedline.dataset import open_dataset
    from feedline.plan.rl import classes_per_batch, disk_order_correlation
    from feedline_tools.make import generate

    n = 20_000
    path = generate("cifar10-large", str(tmp_path / "lmdb"), samples=n, progress=False)
    ds = open_dataset(path)
    labels = np.zeros(n, dtype=np.int64)
    with Loader(ds, 256, seed=0) as ld:
        got = []
        for b in ld:
            got.append(np.asarray(b.ids))
            labels[b.ids] = b.labels
        ids = np.concatenate(got)
        st_ = ld.stats()
    assert np.array_equal(np.sort(ids), np.arange(n))
    assert np.all(np.diff(labels) >= 0) and len(np.unique(labels)) == 10  # class-sorted
    assert classes_per_batch(ids, labels, 256) >= 9
    assert abs(disk_order_correlation(ids)) <= 0.1
    assert st_["storage_bytes"] / max(st_["storage_ops"], 1) >= 64 * 1024  # large reads


def test_the_next_epochs_first_window_is_read_ahead(tmp_path):
    """While the last window of an epoch is consumed, the per-rank source reads the
    first window of the next epoch; the next pass adopts it when it is that epoch from
    step 0 (same bytes as a fresh Loader), and drops it otherwise (a jump, a resume)."""
    from feedline.dataset import open_dataset
    from feedline_tools.make import generate

    path = generate("cifar10-bin", str(tmp_path / "d"), samples=3000, progress=False)
    ds = open_dataset(path, format="records", record_bytes=3073, label_bytes=1)
    kw = {"seed": 4, "source": "direct", "chunk_bytes": 64 << 10, "window_steps": 8}

    def epoch(ld, e):
        ld.set_epoch(e)
        got = [(b.ids.copy(), np.ascontiguousarray(b.data).copy()) for b in ld]
        return np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got])

    with Loader(ds, 100, **kw) as fresh:
        want = {e: epoch(fresh, e) for e in (1, 2, 5)}
    with Loader(ds, 100, **kw) as ld:
        epoch(ld, 0)
        for e in (1, 2):  # expected: adopted
            src = ld._source  # between epochs: what it read ahead and one spare buffer,
            # no more than the two windows live during the epoch
            ahead = sum(w.buf.nbytes for w in src._spec)
            assert ahead and len(src._spare) <= 1
            assert ahead + sum(b.nbytes for b in src._spare) <= ld.stats()["buffer_bytes"]
            ids, data = epoch(ld, e)
            assert np.array_equal(ids, want[e][0]) and np.array_equal(data, want[e][1])
        # the windows of the first 8 steps (1, 1, 2, 4 steps: one window's bytes)
        assert ld.stats()["anticipated_windows"] == 2 * 4
        ids, data = epoch(ld, 5)  # epoch 3 was read ahead: dropped
        assert np.array_equal(ids, want[5][0]) and np.array_equal(data, want[5][1])
        assert ld.stats()["anticipated_windows"] == 2 * 4
        ld.set_epoch(6)  # a pass left early drops what it read ahead too
        it = iter(ld)
        for _ in range(29):
            next(it)
        state = ld.state_dict()
    with Loader(ds, 100, **kw) as again:
        again.load_state_dict(state)
        rest = [b.ids for b in again]
        assert len(rest) == 1
    with Loader(ds, 100, epochs=2, **kw) as told:  # nothing read ahead past the last
        for e in range(3):
            ids, data = epoch(told, e)
            if e in want:
                assert np.array_equal(data, want[e][1])
        assert told.stats()["anticipated_windows"] == 4  # epoch 1's only


def test_the_tile_order_key_is_the_most_balanced_of_the_candidates():
    """The vectorised comparison picks what comparing each key on its own picks (the
    first key of least |rank correlation| with the delivery times), in every batching
    and with the big-integer sums."""
    from feedline.plan import assign_window as aw
    from feedline.plan._perm import permute, subkeys

    def reference(n, tile, key, starts):
        G = -(-n // tile)
        keys = subkeys(np.uint64(key), np.arange(1, aw.TILE_KEYS + 1, dtype=np.uint64))
        v = np.arange(G, dtype=np.int64) * tile
        st = np.asarray(starts, dtype=np.int64)
        u = np.clip(np.searchsorted(st, v, side="right") - 1, 0, len(st) - 2)
        t = (v - st[u]) / np.maximum(st[u + 1] - st[u], 1)
        r = [int(x) for x in np.argsort(np.argsort(t, kind="stable"), kind="stable")]
        best, best_c = None, None
        for k in keys:  # exact rational arithmetic, one key at a time
            p = [int(x) for x in permute(np.arange(G), G, k)]
            m = (G - 1) / 2
            c = abs(sum((a - m) * (b - m) for a, b in zip(r, p, strict=True)))
            if best_c is None or c < best_c:
                best, best_c = int(k), c
        return best

    f = aw._balanced_key_cached.__wrapped__
    rng = np.random.default_rng(5)
    for _ in range(12):
        n, tile = int(rng.integers(10, 20_000)), int(rng.integers(1, 200))
        cut = sorted({int(x) for x in rng.integers(1, n, size=int(rng.integers(0, 4)))})
        starts, key = (0, *cut, n), int(rng.integers(0, 2**63))
        want = reference(n, tile, key, starts)
        assert f(n, tile, key, starts) == want
        old = (aw._PERMUTE_BATCH, aw._EXACT_TILES)
        try:
            aw._PERMUTE_BATCH, aw._EXACT_TILES = 1, 0  # one key per call, object sums
            assert f(n, tile, key, starts) == want
        finally:
            aw._PERMUTE_BATCH, aw._EXACT_TILES = old


def test_span_ratio_counts_each_files_first_to_last_byte():
    from feedline.plan.cost import span_ratio
    from feedline.plan.records import IndexRecords

    # two files; file 1 has a 100-byte gap before its first record; file 2 is unused
    fid = np.array([0, 0, 1, 1, 0], dtype=np.int64)
    off = np.array([0, 10, 100, 150, 20], dtype=np.int64)
    ln = np.array([10, 10, 50, 50, 30], dtype=np.int64)
    # spans: file 0 [0, 50) = 50, file 1 [100, 200) = 100; payload 150
    assert span_ratio(IndexRecords(fid, off, ln)) == pytest.approx(1.0)
    off1 = np.array([0, 10, 100, 250, 20], dtype=np.int64)  # file 1: [100, 300) = 200
    assert span_ratio(IndexRecords(fid, off1, ln)) == pytest.approx(250 / 150)
    one = IndexRecords(np.zeros(3, np.int64), np.array([5, 40, 20]), np.array([10, 10, 10]))
    assert span_ratio(one) == pytest.approx(45 / 30)


def test_a_few_huge_records_do_not_shrink_the_windows():
    """JPEG-like lengths (lognormal around 100 KB, a few files of 5-14 MB): the chooser
    sizes windows for the sum of their longest records, not their count times the
    largest file (which left 2-step windows and one request per 0.9 MiB at 64 ranks).
    Every window of the plan it makes holds at most what it was sized for."""
    from feedline.plan.reads import window_cap, window_steps, windows
    from feedline.plan.records import IndexRecords

    rng = np.random.default_rng(0)
    n = 200_000
    ln = np.clip(rng.lognormal(np.log(100_000), 0.6, n), 2000, None).astype(np.int64)
    ln[rng.choice(n, 8, replace=False)] = rng.integers(5_000_000, 15_000_000, 8)
    off = np.concatenate([[0], np.cumsum(ln + 64)[:-1]])
    rec = IndexRecords(np.zeros(n, np.int64), off, ln)
    world, cap = WorldSpec(64, 8), int(2.5e9)
    c = choose(rec, world, 256, cap, get_profile("parallel"), store="x")
    assert c.best.window_steps >= 16 and c.best.mean_read >= 4 * 2**20, c.explain()
    # counted as that many times the largest file: 2-step windows, a 10th of the reads
    slot = IndexRecords(np.zeros(n, np.int64), off, ln)
    slot.top_bytes = lambda k: int(k) * int(ln.max())  # type: ignore[method-assign]
    old = choose(slot, world, 256, cap, get_profile("parallel"), store="x")
    assert old.best.window_steps <= 4 and old.best.requests > 8 * c.best.requests
    plan = make_plan(rec, world, c.strategy, 0, 0, 256, memory_cap=cap)
    node = c.strategy.aggregated
    unit = 256 // 64 * (8 if node else 1)  # a unit's samples per step
    assert rec.top_bytes(window_steps(plan) * unit) <= window_cap(plan)
    for r in windows(plan)[:20]:  # what each unit's window holds: within that bound
        for u in range(8 if node else 64):
            get = plan.node_samples if node else plan.samples
            ids = np.concatenate([get(u, step) for step in r])
            assert len(ids) == len(set(ids.tolist())) <= len(r) * unit
            assert ln[ids].sum() <= rec.top_bytes(len(r) * unit)


def test_the_cpu_term_counts_ranks_against_cores(monkeypatch):
    """The ``cpu`` term: one rank's delivery CPU when each rank has a core (the storage's
    CPU may take spare cores); the host's work over its cores, at a falling efficiency,
    when ranks share cores; decoding adds. Every candidate pays the same delivery, so the
    choice at scale does not move."""
    from feedline.dist.world import _busier
    from feedline.plan import cost, store_cost
    from feedline.plan.cost import (
        CPU_COPY_BW,
        CPU_STEP_S,
        DECODE_RECORD_S,
        SHARED_CORE_EFFICIENCY,
        cpu_s,
        shape_of,
    )

    rec, world = FlatRecords(200_000, 3_000), WorldSpec(8, 4)
    own = shape_of(rec, world, 2048, 625_000_000)  # a core per rank (the default)
    steps = -(-200_000 // 2048)
    per_rank = steps * CPU_STEP_S + 200_000 * 3_000 / 8 / CPU_COPY_BW
    local = PROFILES["local"]
    assert cpu_s(own, local, 6e8) == pytest.approx(per_rank)

    def on(ranks, cores, **kw):
        return shape_of(rec, world, 2048, 625_000_000, host=(ranks, cores), **kw)

    # 8 ranks on 2 cores: the host's work over 2 cores at the lowest efficiency
    assert cpu_s(on(8, 2), local, 6e8) == pytest.approx(8 * per_rank / (2 * SHARED_CORE_EFFICIENCY))
    # 3 ranks on 2 cores: half way down; it never falls as ranks are added
    eff3 = 1 - (1 - SHARED_CORE_EFFICIENCY) * 0.5
    assert cpu_s(on(3, 2), local, 0) == pytest.approx(3 * per_rank / (2 * eff3))
    seq = [cpu_s(on(r, 2), local, 0) for r in range(1, 9)]
    assert seq == sorted(seq) and seq[0] == seq[1] == pytest.approx(per_rank)
    # enough cores: as if each had its own
    assert cpu_s(on(8, 16), local, 0) == pytest.approx(per_rank)
    # the storage's CPU on the host (the emulator's daemon): the host's share of the bytes
    # read; one rank on 2 cores lets the daemon run on the other
    daemon = dataclasses.replace(local, host_cpu_per_byte=1e-9)
    assert cpu_s(on(8, 2), daemon, 6e8) == pytest.approx(
        (8 * per_rank + 6e8 * 1e-9) / (2 * SHARED_CORE_EFFICIENCY)
    )
    one = shape_of(rec, WorldSpec(1), 2048, 625_000_000, host=(1, 2))
    one_rank = steps * CPU_STEP_S + 6e8 / CPU_COPY_BW
    assert cpu_s(one, daemon, 6e8) == pytest.approx(max(one_rank, (one_rank + 0.6) / 2))
    dec = shape_of(rec, world, 2048, 625_000_000, record_cpu_s=DECODE_RECORD_S)
    assert cpu_s(dec, local, 0) == pytest.approx(per_rank + 25_000 * DECODE_RECORD_S)
    # every candidate (window plans and the store) carries it, and explain shows it and
    # the host it assumed
    ch = choose(rec, world, 2048, 625_000_000, local, host=(8, 2), store=True)
    assert all(c.terms["cpu"] > 0 for c in ch.candidates if not c.rejected)
    assert ch.best.terms["cpu"] == pytest.approx(cpu_s(on(8, 2), local, 0))
    lines = ch.explain().splitlines()
    assert "cpu" in next(x for x in lines if "cost s" in x).split()
    assert "cpu term: 8 ranks per host on 2 cores (ranks take turns)" in lines
    assert ch.to_dict()["host"] == {"ranks": 8, "cores": 2, "record_cpu_s": 0.0}
    # at the papers' scale the term leaves the choice as it was without it
    big = LmdbModel(50_000_000, 3072)
    a = choose(big, WorldSpec(9216, 256), 18432, 2_500_000_000, "parallel")
    assert a.best.terms["cpu"] > 0
    monkeypatch.setattr(cost, "cpu_s", lambda *_: 0.0)
    monkeypatch.setattr(store_cost, "cpu_s", lambda *_: 0.0)
    b = choose(big, WorldSpec(9216, 256), 18432, 2_500_000_000, "parallel")
    assert b.best.terms["cpu"] == 0.0 and a.strategy == b.strategy
    # the World's host is the busiest of the job's (every rank chooses from the same)
    assert max([(3, 2), (4, 2), (3, 4), (4, 4)], key=_busier) == (4, 2)


def test_the_loader_and_plan_cli_price_the_hosts_cpu(tmp_path, capsys):
    """A Loader gives the model its host (one process: 1 rank, its cores) and whether it
    decodes; ``feedline plan --ranks-per-host R --cores-per-node C --decode`` does the
    same for a job planned elsewhere; the emulator's profile charges its daemon's CPU."""
    from feedline.cli import main
    from feedline.dataset import open_dataset
    from feedline.io.profiles import _emulator_profile
    from feedline_tools.make import generate

    path = generate("cifar10-bin", str(tmp_path / "d"), samples=3000, progress=False)
    ds = open_dataset(path, format="records", record_bytes=3073, label_bytes=1)
    terms = {}
    for dec in (False, True):
        with Loader(ds, 100, seed=1, profile="local", decode=dec) as ld:
            assert ld.world.host[0] == 1 and ld.world.host[1] >= 1
            terms[dec] = ld.stats()["plan_estimate_terms"]["cpu"]
    assert terms[True] == pytest.approx(terms[False] + 3000 * 1e-6)
    args = "plan --ranks 64 --nodes 2 --preset feedline --samples 200000 --sample-bytes 3072"
    args += " --profile local --explain"
    assert main(args.split()) == 0
    own = capsys.readouterr().out
    assert main([*args.split(), "--cores-per-node", "4", "--decode"]) == 0
    few = capsys.readouterr().out
    # 8 emulated nodes on one 2-core machine, as a Loader under FEEDLINE_NODES sees them
    emu = "plan --ranks 8 --nodes 4 --preset feedline --samples 200000 --sample-bytes 3072"
    assert main([*emu.split(), "--explain", "--ranks-per-host", "8", "--cores-per-node", "2"]) == 0
    shared = capsys.readouterr().out

    def chosen_cpu(text):
        lines = text.splitlines()
        cols = next(x for x in lines if "cost s" in x).split()
        row = next(x for x in lines if x.startswith("* "))
        return float(row.split()[-(len(cols) - cols.index("cpu"))])

    assert chosen_cpu(few) > 8 * chosen_cpu(own)
    assert "32 ranks per host on 4 cores (ranks take turns), decoding" in few
    assert "8 ranks per host on 2 cores" in shared
    for bad in ("0", "-2"):
        with pytest.raises(SystemExit):
            main([*args.split(), "--cores-per-node", bad])
    emu_profile = _emulator_profile(
        {
            "params": {
                "server_mbps": 1000,
                "latency_us": 100,
                "node_mbps": 1000,
                "aggregate_mbps": 2000,
                "server_concurrency": 4,
                "servers": 4,
            }
        }
    )
    assert emu_profile["host_cpu_per_byte"] > 0
