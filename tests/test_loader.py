# SPDX-License-Identifier: Apache-2.0
"""The Loader on real files: exactly-once delivery, bytes, presets, threads, errors, cap."""

from __future__ import annotations

import _thread
import hashlib
import os
import sys
import threading
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "mpi"))
from loader_common import make_records, open_records, write_records

from feedline import Batch, ConfigError, CorruptDataError, Loader, StorageError
from feedline.pipeline.world import LoaderWorld

PRESETS = ["feedline", "tf", "tf-pre", "async", "async-db"]


def feedline_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("feedline")]


@pytest.fixture
def records(tmp_path):
    return make_records(str(tmp_path / "ds"), n=300, size=24, files=3)


def run_epoch(loader: Loader) -> list[Batch]:
    return list(loader)


def digest(batches_by_rank: list[list[Batch]]) -> str:
    """The bench digest (docs/benchmarks.md): rank, step, then per sample id, length and bytes."""
    h = hashlib.sha256()
    for rank, batches in enumerate(batches_by_rank):
        for b in batches:
            h.update(np.uint32(rank).tobytes() + np.uint64(b.step).tobytes())
            raw = np.ascontiguousarray(b.data).reshape(-1)
            pos = 0
            for i, ln in zip(b.ids.tolist(), b.lengths.tolist(), strict=True):
                h.update(np.uint64(i).tobytes() + np.uint64(ln).tobytes())
                h.update(raw[pos : pos + ln].tobytes())
                pos += ln
    return h.hexdigest()


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("ranks", [1, 3])
def test_every_sample_once_with_its_bytes(records, preset, ranks):
    ds, data = records
    per_rank = []
    for r in range(ranks):
        with Loader(ds, 40, preset=preset, seed=11, comm=LoaderWorld(r, ranks), buffer=16) as ld:
            assert len(ld) == 8  # ceil(300 / 40)
            batches = run_epoch(ld)
            assert [b.step for b in batches] == list(range(8))  # equal steps on every rank
            for b in batches:
                assert b.data.shape == (len(b.ids), 24) and b.data.dtype == np.uint8
                np.testing.assert_array_equal(b.data, data[b.ids])
                np.testing.assert_array_equal(b.lengths, np.full(len(b.ids), 24))
            per_rank.append(batches)
    for s in range(8):  # sub-batch sizes differ by at most one, lower ranks take more
        sizes = [len(per_rank[r][s].ids) for r in range(ranks)]
        assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    ids = np.concatenate([b.ids for batches in per_rank for b in batches])
    assert sorted(ids.tolist()) == list(range(300))


def test_presets_sharing_an_assignment_deliver_identical_bytes(records):
    ds, _ = records

    def run(preset):
        out = []
        for r in range(2):
            with Loader(ds, 32, preset=preset, seed=3, comm=LoaderWorld(r, 2), buffer=20) as ld:
                out.append(run_epoch(ld))
        return digest(out)

    assert run("tf") == run("tf-pre")  # global shuffle, per-sample reads
    assert run("async") == run("async-db")  # chunk groups, rank layout
    assert run("tf") != run("async")  # different assignments: a digest that can differ


def test_order_is_seeded_per_epoch_and_reproducible(records):
    ds, _ = records
    with Loader(ds, 50, preset="tf", seed=1) as a, Loader(ds, 50, preset="tf", seed=1) as b:
        e0 = np.concatenate([x.ids for x in a])
        assert np.array_equal(e0, np.concatenate([x.ids for x in b]))
        a.set_epoch(1)
        e1 = np.concatenate([x.ids for x in a])
        assert not np.array_equal(e0, e1) and sorted(e1.tolist()) == list(range(300))
    with Loader(ds, 50, preset="tf", seed=2) as c:
        assert not np.array_equal(e0, np.concatenate([x.ids for x in c]))


@pytest.mark.parametrize("preset", ["feedline", "async-db"])
def test_shuffle_false_is_file_order(records, preset):
    ds, _ = records
    with Loader(ds, 64, preset=preset, shuffle=False) as ld:
        ids = np.concatenate([b.ids for b in ld])
    assert np.array_equal(ids, np.arange(300))


def test_drop_last_and_len(records):
    ds, _ = records
    with Loader(ds, 64, preset="tf", drop_last=True) as ld:
        assert len(ld) == 4
        batches = run_epoch(ld)
    assert len(batches) == 4 and all(len(b) == 64 for b in batches)
    assert len(set(np.concatenate([b.ids for b in batches]).tolist())) == 256


def test_transform_runs_in_worker_threads(records):
    ds, _ = records
    where = set()

    def transform(b):
        where.add(threading.current_thread().name)
        return Batch(b.data.astype(np.float32) / 255, b.labels, b.ids, b.lengths, b.step, b.epoch)

    with Loader(ds, 60, preset="feedline", transform=transform, workers=2) as ld:
        batches = run_epoch(ld)
    assert batches[0].data.dtype == np.float32
    assert where and all(n.startswith("feedline") and "work" in n for n in where)


def test_raw_variable_and_decoded_shapes(tmp_path):
    paths, data = write_records(str(tmp_path / "v"), n=50, size=16, files=1)
    ds = open_records(paths, 16)
    with Loader(ds, 20, preset="tf", decode=False) as ld:
        b = next(iter(ld))
    assert b.data.shape == (20, 16)
    np.testing.assert_array_equal(b.data, data[b.ids])


def _leak_free(before: list[str], keep_pool: bool = False) -> None:
    """No feedline thread beyond *before*; with *keep_pool* the open loader's idle I/O
    pool may stay (it is reused by the next pass and joined by close)."""

    def extra():
        names = [n for n in feedline_threads() if n not in before]
        return [n for n in names if not (keep_pool and n.startswith("feedline-pool"))]

    deadline = time.time() + 5
    while extra() and time.time() < deadline:
        time.sleep(0.02)
    assert extra() == []


@pytest.mark.parametrize("preset", PRESETS)
def test_break_and_exceptions_leave_no_threads(records, preset):
    ds, _ = records
    before = feedline_threads()
    ld = Loader(ds, 20, preset=preset, buffer=16)
    for i, _b in enumerate(ld):
        if i == 2:
            break
    _leak_free(before, keep_pool=True)  # dropping the iterator stopped the pass
    with pytest.raises(RuntimeError, match="boom"), ld:
        for i, _b in enumerate(ld):
            if i == 3:
                raise RuntimeError("boom")
    _leak_free(before)
    assert ld.stats()["steps"] == 7


def test_ctrl_c_while_waiting_stops_cleanly(records):
    ds, _ = records
    before = feedline_threads()

    def slow(b):
        time.sleep(0.2)
        return b

    ld = Loader(ds, 10, preset="feedline", transform=slow)
    timer = threading.Timer(0.3, _thread.interrupt_main)
    t0 = time.perf_counter()
    with pytest.raises(KeyboardInterrupt), ld:
        timer.start()
        for _ in ld:
            pass
    timer.join()
    assert time.perf_counter() - t0 < 5
    _leak_free(before)


def test_storage_error_surfaces_typed(tmp_path):
    paths, _ = write_records(str(tmp_path / "e"), n=90, size=24, files=3)
    ds = open_records(paths, 24)
    _ = ds.index
    os.unlink(paths[1])  # persistent failure: the file is gone
    for preset in ("feedline", "async-db", "tf"):
        before = feedline_threads()
        with (
            pytest.raises(StorageError) as ei,
            Loader(ds, 30, preset=preset, buffer=10, seed=1) as ld,
        ):
            for _ in ld:
                pass
        assert ei.value.path == paths[1] and ei.value.errno == 2
        _leak_free(before)


def test_truncated_file_is_corrupt_data(tmp_path):
    paths, _ = write_records(str(tmp_path / "t"), n=90, size=24, files=1)
    ds = open_records(paths, 24)
    _ = ds.index
    with open(paths[0], "r+b") as f:
        f.truncate(24 * 45 + 5)
    with pytest.raises(CorruptDataError) as ei, Loader(ds, 30, preset="async", buffer=90) as ld:
        for _ in ld:
            pass
    assert ei.value.path == paths[0] and ei.value.offset == 24 * 45 + 5


def test_memory_cap_rejects_up_front_with_advice(records):
    ds, _ = records
    with pytest.raises(ConfigError, match=r"memory_cap|memory cap"):
        Loader(ds, 300, preset="async-db", buffer=300, memory_cap=4096)
    with pytest.raises(ConfigError, match=r"memory"):
        Loader(ds, 300, preset="tf-pre", memory_cap="2KiB")
    with Loader(ds, 30, preset="async-db", buffer=30, memory_cap="1MiB") as ld:
        assert ld.stats()["memory_estimate_bytes"] <= 1 << 20


def test_unknown_options_and_presets_are_config_errors(records):
    ds, _ = records
    with pytest.raises(ConfigError, match="unknown strategy knob"):
        Loader(ds, 10, prefetch=3)
    with pytest.raises(ConfigError, match="unknown preset"):
        Loader(ds, 10, preset="nope")
    with pytest.raises(ConfigError):
        Loader(ds, 0)
    with pytest.raises(ConfigError):
        Loader(ds, 10, buffer="lots")


def test_stats_report_io_and_exposure(records):
    ds, _ = records
    with Loader(ds, 30, preset="tf") as ld:
        run_epoch(ld)
        st = ld.stats()
    assert st["storage_ops"] == 300 and st["storage_bytes"] == 300 * 24  # one read per sample
    assert st["samples"] == 300 and st["payload_bytes"] == 300 * 24 and st["steps"] == 10
    assert st["exposed_io_s"] > 0 and st["peak_rss_bytes"] > 0
    assert st["ctx_switches_voluntary"] >= 0
    assert st["rl"] > 0.99  # a full shuffle (DeepIO's randomization level)
    with Loader(ds, 30, preset="async", buffer=60, seed=4, epochs=1) as ld:
        run_epoch(ld)
        st = ld.stats()
    # one read per group of 60 (a group spanning two files takes two); epochs=1: no
    # next epoch's group read ahead (whose read, in flight when the stats are taken,
    # would count in storage_ops before it counts as anticipated)
    assert st["group_reads"] == 5 and st["anticipated_groups"] == 0
    assert 5 <= st["storage_ops"] <= 7
    assert st["buffer_bytes"] == 60 * 24 and st["buffers"] == 1
    with Loader(ds, 30, preset="async-db", buffer="480B", seed=4) as ld:  # 20 samples
        run_epoch(ld)
        st = ld.stats()
    assert st["buffers"] == 2 and st["buffer_bytes"] == 2 * 20 * 24
    assert st["group_reads"] - st["anticipated_groups"] == 15


def test_double_buffering_hides_reads_behind_compute(tmp_path):
    """Exposed time: the consumer waits less when the next batch is read during compute."""
    paths, _ = write_records(str(tmp_path / "s"), n=80, size=24, files=1)
    ds = open_records(paths, 24)
    delay = 0.05

    def slow_io(b):  # stands in for slow storage: runs where the batch is prepared
        time.sleep(delay)
        return b

    def exposed(depth):
        with Loader(ds, 10, preset="feedline", transform=slow_io, prefetch_depth=depth) as ld:
            for _ in ld:
                time.sleep(2 * delay)  # compute
            return ld.stats()["exposed_io_s"]

    sync, db = exposed(0), exposed(2)
    assert sync >= 8 * delay  # every read waited for
    assert db < 0.6 * sync  # only the first read (plus scheduling noise) is exposed


def test_state_iter_restarts_finished_epoch(records):
    ds, _ = records
    with Loader(ds, 100, preset="tf") as ld:
        a = [b.ids for b in ld]
        b = [b.ids for b in ld]  # same epoch again: same order, from the start
    assert len(a) == 3 and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_torchrun_without_mpi_is_refused(records, monkeypatch):
    ds, _ = records
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError, match="torchrun"):
        Loader(ds, 10)


def test_environment_overrides_defaults(records, monkeypatch):
    ds, _ = records
    monkeypatch.setenv("FEEDLINE_ASYNC_BUFFER", "25")
    monkeypatch.setenv("FEEDLINE_PREFETCH_DEPTH", "3")
    monkeypatch.setenv("FEEDLINE_WORKERS", "2")
    with Loader(ds, 30, preset="async", seed=1) as ld:
        run_epoch(ld)
        assert ld.stats()["group_reads"] == 12  # 300 samples in groups of 25
    with Loader(ds, 30, preset="feedline") as ld, Loader(ds, 30, preset="tf") as tf:
        assert ld.strategy.prefetch_depth == 3 and ld.options.workers == 2
        assert tf.strategy.prefetch_depth == 0  # TF's baseline never prefetches
    with Loader(ds, 30, preset="feedline", prefetch_depth=1, workers=1) as ld:
        assert ld.strategy.prefetch_depth == 1 and ld.options.workers == 1  # arguments win


def _ids(batches: list[Batch]) -> list[list[int]]:
    return [b.ids.tolist() for b in batches]


@pytest.mark.parametrize("preset", ["async", "async-db"])
def test_anticipated_first_group_is_used_only_when_it_matches(records, preset):
    """The I/O thread reads the next epoch's groups ahead; set_epoch(e + 1) uses them,
    anything else (another epoch, a resume elsewhere, a break) discards it, and the
    batches are always those of a Loader that never anticipates."""
    ds, _ = records

    def fresh(epoch: int) -> list[Batch]:
        with Loader(ds, 30, preset=preset, buffer=40, seed=2) as ref:
            ref.set_epoch(epoch)
            return run_epoch(ref)

    with Loader(ds, 30, preset=preset, buffer=40, seed=2) as ld:
        ld.set_epoch(0)
        e0 = run_epoch(ld)
        ld.set_epoch(1)
        e1 = run_epoch(ld)
        assert ld.stats()["adopted_passes"] == 1  # epoch 1 was being read ahead
        ld.set_epoch(7)  # not what was anticipated (8): dropped, read afresh
        e7 = run_epoch(ld)
        assert ld.stats()["adopted_passes"] == 1
        ld.set_epoch(8)
        it = iter(ld)
        first = [next(it) for _ in range(3)]
        assert ld.stats()["adopted_passes"] == 2
        state = ld.state_dict()
        del it  # a break: the anticipation of epoch 9 is cancelled, not waited for
        ld.load_state_dict(state)
        rest = run_epoch(ld)
        data = [b.data.tobytes() for b in e1]
    for got, epoch in ((e0, 0), (e1, 1), (e7, 7), (first + rest, 8)):
        want = fresh(epoch)
        assert _ids(got) == _ids(want), f"epoch {epoch}"
    assert data == [b.data.tobytes() for b in fresh(1)]
    assert not feedline_threads()


def test_feedline_reads_direct_only_when_the_page_cache_cannot_keep_the_data(records, monkeypatch):
    ds, data = records
    # windows (the store, when the model takes it, reads with O_DIRECT whatever the
    # size: tests/test_store.py::test_store_auto_semantics_and_resume_across_choices)
    with Loader(ds, 30, store="off") as ld:
        # 7 KB: the page cache keeps it; tiles are read without kernel read-ahead
        assert ld.strategy.read == "pread-random"
        got = run_epoch(ld)
    for b in got:
        np.testing.assert_array_equal(b.data, data[b.ids])
    monkeypatch.setenv("FEEDLINE_DIRECT_ABOVE", "1000")
    with Loader(ds, 30, store="off") as ld:
        assert ld.strategy.read == "odirect"
        got = run_epoch(ld)
    ids = np.concatenate([b.ids for b in got])
    assert sorted(ids.tolist()) == list(range(300))
    for b in got:  # identical bytes whatever the read method
        np.testing.assert_array_equal(b.data, data[b.ids])
    with Loader(ds, 30, read="pread") as ld:
        assert ld.strategy.read == "pread"  # an explicit read= wins


@pytest.mark.parametrize("ranks", [1, 2])
def test_direct_reads_land_in_place(tmp_path, ranks):
    """With ``odirect`` the per-rank windows are widened to whole blocks and placed at
    aligned offsets of aligned buffers, so the engine reads straight into them: only
    the tail of a file that does not end on a block boundary goes through its bounce
    buffer (a copy of every byte before), and the bytes delivered are the same."""
    ds, data = make_records(str(tmp_path / "ds"), n=6000, size=1000, files=3)  # 2 MB each
    kw = dict(store="off", source="direct", read="odirect", chunk_bytes=256 << 10, seed=3)
    got, bounced, storage = [], 0, 0
    for r in range(ranks):
        with Loader(ds, 64, comm=LoaderWorld(r, ranks), **kw) as ld:
            got += run_epoch(ld)
            st = ld.stats()
            # the knob wins over the model's tile in records (it was ignored), and says so
            assert ld.strategy.chunk == 0 and st["plan"].endswith("then chunk_bytes=262144")
            bounced += st["bounced_bytes"]
            storage += st["storage_bytes"]
    ids = np.concatenate([b.ids for b in got])
    assert sorted(ids.tolist()) == list(range(6000))
    for b in got:
        np.testing.assert_array_equal(b.data, data[b.ids])
    assert storage >= 6000 * 1000
    assert 0 < bounced <= 3 * 4096 * ranks  # the files' tails (2,000,000 B: 1,152 B each)


def test_direct_buffers_stay_within_the_memory_estimate(tmp_path):
    """Windows widened to whole blocks (odirect) are counted in the memory estimate."""
    ds, data = make_records(str(tmp_path / "ds"), n=240, size=100_001, files=3)
    for kw in (dict(preset="tf", read="odirect"), dict(store="off", read="odirect")):
        with Loader(ds, 16, seed=1, **kw) as ld:
            est = ld._source.memory_bytes(ld._plan(0))
            for b in ld:
                np.testing.assert_array_equal(b.data, data[b.ids])
            assert ld.stats()["buffer_bytes"] <= est


def test_the_next_epochs_read_ahead_reuses_a_spare_window(monkeypatch):
    """The read-ahead of the next epoch's first window takes a kept buffer of exactly
    its size (it asked for a block-rounded size, which the spare could not hold, and
    allocated a third window's memory)."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    import feedline.plan.reads as reads
    from feedline.sources.direct import DirectSource

    S = 1_000_000  # not a multiple of 4096: a pread window, not widened
    ids = np.arange(4)
    op = reads.ReadOp(0, 0, range(0, 4), np.array([0]), np.array([0]), np.array([S]), ids,
                      ids, np.zeros(4, np.int64), ids * 250_000, np.full(4, 250_000))  # fmt: skip

    class Reader:
        def submit(self, reads, buf):
            f: Future = Future()
            f.set_result(None)
            return f

    monkeypatch.setattr(reads, "iter_reads", lambda plan, rank: iter([op]))
    monkeypatch.setattr(reads, "window_steps", lambda plan: 4)
    src = object.__new__(DirectSource)
    src._next_plan, src._reader, src._align = (lambda: "next"), Reader(), (0, None)
    spare = np.empty(S, np.uint8)
    src._spare, src._spec = [spare], []
    src._live = [SimpleNamespace(base=np.empty(S, np.uint8))]
    src.ctx = SimpleNamespace(rank=0)
    src._speculate()
    assert len(src._spec) == 1 and np.shares_memory(src._spec[0].base, spare)
    assert src._spare == []
