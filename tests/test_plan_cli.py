# SPDX-License-Identifier: Apache-2.0
"""``feedline plan`` and the vectorised plan statistics behind it."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedline.cli import build_parser, main
from feedline.plan import PRESETS, FlatRecords, WorldSpec, get_strategy, make_plan
from feedline.plan.lmdb_model import LmdbModel, nodemax
from feedline.plan.stats import plan_stats, unit_extents


@pytest.mark.parametrize("preset", sorted(PRESETS))
@given(P=st.integers(1, 24), data=st.data())
@settings(max_examples=6, deadline=None)
def test_vectorised_extents_match_the_read_operations(preset, P, data):
    M = data.draw(st.integers(1, P))
    n = data.draw(st.integers(0, 400))
    B = data.draw(st.integers(1, 64))
    rec = LmdbModel(n, data.draw(st.sampled_from([100, 1000, 3072])))
    s = get_strategy(preset, coalesce_bytes=PRESETS[preset].coalesce_bytes and 20_000)
    plan = make_plan(rec, WorldSpec(P, M), s, 3, 1, B, memory_cap=1 << 24)
    s = plan.strategy  # the feedline preset's plan carries the cost model's choice
    for reader in plan.readers:
        node = plan.world.node_of(reader)
        unit = node if s.aggregated else reader
        ex = unit_extents(plan, unit)
        i = plan.readers_of(node).index(reader) if s.aggregated else 0
        mine = ex["key"] % ex["k"] == i
        ops = plan.reads(reader)
        assert sorted(ex["length"][mine].tolist()) == sorted(
            x for op in ops for x in op.lengths.tolist()
        )


def test_stats_agree_with_the_reads_for_every_reader():
    rec = FlatRecords(3000, 100)
    plan = make_plan(rec, WorldSpec(8, 2), "lmm-dio-prov-coal", batch_size=64, memory_cap=1 << 20)
    st_ = plan_stats(plan, "x", units=100)
    ops = [plan.reads(r) for r in plan.readers]
    assert st_["readers"] == len(plan.readers) == 2
    assert st_["bytes_per_reader"] == pytest.approx(
        np.mean([sum(o.nbytes for o in rd) for rd in ops])
    )
    assert st_["ops_per_reader"] == pytest.approx(
        np.mean([sum(o.num_reads for o in rd) for rd in ops])
    )
    assert st_["largest_read"] == max(int(o.lengths.max()) for rd in ops for o in rd if o.num_reads)
    assert st_["payload_bytes_total"] == pytest.approx(3000 * 100)
    assert st_["redundant_bytes_total"] == 0  # flat records, no seeks


def test_lmdb_model_matches_liblmdb_rules():
    assert nodemax(4096) == 2038
    small, big = LmdbModel(1000, 1000), LmdbModel(1000, 3072)
    assert not small.overflow and big.overflow
    assert big.overflow_pages == 1 and LmdbModel(10, 196608).overflow_pages == 49
    # records never overlap and stay inside the file
    for m in (small, big):
        _, off, ln = m.extents(np.arange(m.n))
        o = np.argsort(off)
        assert (np.diff(off[o]) >= ln[o][:-1]).all() and off.min() >= 0
        assert (off + ln).max() <= m.file_bytes


@pytest.mark.parametrize("size", [1000, 3072])
def test_lmdb_model_matches_a_file_written_by_liblmdb(tmp_path, size):
    lmdb = pytest.importorskip("lmdb")
    from feedline import open_dataset

    n = 3000
    env = lmdb.open(str(tmp_path), map_size=1 << 28)
    for c in range(0, n, 1000):  # Caffe's convert_imageset commits every 1,000 puts
        with env.begin(write=True) as txn:
            for i in range(c, min(c + 1000, n)):
                txn.put(b"%08d" % i, bytes([i % 251]) * size, append=True)
    env.close()
    idx = open_dataset(str(tmp_path), sidecar=False).index
    model = LmdbModel(n, size)
    assert idx.meta["leaf_pages"] == model.leaf_pages
    assert idx.meta.get("overflow_pages", 0) == n * model.overflow_pages
    assert model.file_bytes == pytest.approx((tmp_path / "data.mdb").stat().st_size, rel=0.02)
    _, off, ln = model.extents(np.arange(n))
    assert np.array_equal(ln, idx.lengths)
    # the spacing between consecutive records is what liblmdb produced, bar a few relocations
    assert (np.diff(off) == np.diff(idx.offsets)).mean() > 0.98
    # `feedline plan PATH` plans over the real index; the seek model walks its leaf pages
    from feedline.plan.cli import compute

    args = build_parser().parse_args(
        ["plan", str(tmp_path), "--ranks", "8", "--nodes", "2", "--batch", "64"]
    )
    rows = {r["preset"]: r for r in compute(args)["presets"]}
    walk = idx.meta["leaf_pages"] * idx.meta["page_size"]
    assert rows["lmdb"]["seek_bytes_total"] == 8 * walk
    assert rows["lmm-dio"]["seek_bytes_total"] == walk
    assert rows["lmm-dio-prov"]["seek_bytes_total"] == 0
    assert rows["tf"]["payload_bytes_total"] == pytest.approx(n * size)


def test_cli_synthetic_all_presets(tmp_path, capsys):
    out = tmp_path / "plan.json"
    rc = main(
        ["plan", "--ranks", "64", "--nodes", "16", "--batch", "256", "--samples", "200000",
         "--sample-bytes", "3072", "--layout", "lmdb", "--json", str(out)]
    )  # fmt: skip
    assert rc == 0
    text = capsys.readouterr().out
    for name in PRESETS:
        assert name in text
    doc = json.loads(out.read_text())
    rows = {r["preset"]: r for r in doc["presets"]}
    assert set(rows) == set(PRESETS)
    # what the papers say the optimisations do
    # every rank walks the tree (64 walks) vs one root per node (16 walks)
    assert rows["lmdb"]["redundant_bytes_total"] > 3 * rows["lmm"]["redundant_bytes_total"] > 0
    assert rows["lmm-dio-prov"]["redundant_bytes_total"] == 0
    assert rows["lmm-dio-prov-coal"]["ops_per_reader"] < rows["lmm-dio-prov"]["ops_per_reader"] / 10
    assert (
        rows["lmm-dio-prov-coal-stag"]["concurrent_readers"]
        < rows["lmm-dio-prov-coal"]["concurrent_readers"]
    )
    assert rows["skip"]["redundant_bytes_total"] > rows["contiguous"]["redundant_bytes_total"]
    assert rows["tf"]["rl"] == 1.0 and rows["lmdb"]["rl"] == 0.0
    assert rows["async"]["largest_read"] > rows["tf"]["largest_read"]
    for r in rows.values():
        assert r["payload_bytes_total"] == pytest.approx(200000 * 3072, rel=0.02)


def test_cli_flat_single_preset_and_errors(capsys):
    assert (
        main(
            [
                "plan",
                "--ranks",
                "4",
                "--preset",
                "tf",
                "--samples",
                "1000",
                "--layout",
                "flat",
                "--json",
                "-",
            ]
        )
        == 0
    )
    io = capsys.readouterr()
    doc = json.loads(io.out)  # --json -: the JSON alone on stdout, the table on stderr
    assert doc["presets"][0]["ops_per_reader"] == 250
    assert "ops/reader" in io.err
    assert main(["plan", "--ranks", "4"]) == 1  # neither PATH nor --samples
    assert main(["plan", "--ranks", "4", "--samples", "10", "--preset", "nope"]) == 1
    # zero or bad values are refused by name, not replaced by a default
    for bad in (["--batch", "0"], ["--sample-bytes", "0"], ["--epochs", "0"], ["--ranks", "0"],
                ["--memory-cap", "12XB"]):  # fmt: skip
        with pytest.raises(SystemExit):
            main(["plan", "--samples", "1000", *bad])
        assert f"argument {bad[0]}" in capsys.readouterr().err
    # one sampled-readers count per preset when they differ
    assert main(["plan", "--ranks", "64", "--nodes", "8", "--preset",
                 "feedline,lmm-dio-prov-coal", "--batch", "128", "--samples", "1000000",
                 "--json", "-"]) == 0  # fmt: skip
    io = capsys.readouterr()
    n = {r["preset"]: r["sampled_readers"] for r in json.loads(io.out)["presets"]}
    if len(set(n.values())) > 1:
        assert "sampled readers feedline " + str(n["feedline"]) in io.err
    else:
        assert f"{n['feedline']} sampled readers per preset" in io.err


@pytest.mark.full
def test_cli_at_paper_scale_is_fast(capsys):
    # CPU time: the machine is shared, wall time measures the neighbours
    t0 = time.process_time()
    rc = main(
        ["plan", "--ranks", "9216", "--nodes", "256", "--preset", "all", "--batch", "18432",
         "--samples", "50000000", "--sample-bytes", "3072", "--layout", "lmdb"]
    )  # fmt: skip
    assert rc == 0 and time.process_time() - t0 < 10


def test_cli_over_a_records_file(tmp_path, capsys):
    path = tmp_path / "x.bin"
    np.arange(1000 * 64, dtype=np.float32).tofile(path)
    argv = ["plan", str(path), "--format", "records", "--record-bytes", "256", "--ranks", "8"]
    assert main([*argv, "--nodes", "2", "--batch", "32", "--preset", "tf", "--json", "-"]) == 0
    text = capsys.readouterr().out
    row = json.loads(text[text.index("{") :])["presets"][0]
    assert row["payload_bytes_total"] == 1000 * 256 and row["ops_per_reader"] == 125


@pytest.mark.parametrize("preset", ["lmm", "lmm-dio-prov-coal"])
def test_sampled_windows_stand_for_the_whole_epoch(preset, monkeypatch):
    """Units with many windows are summarised from SAMPLED_WINDOWS of them (planning
    cost bounded at any number of samples); the figures stay within 2% of the exact
    ones (measured at 50 M samples: within 1.4%)."""
    import feedline.plan.stats as pstats

    rec = LmdbModel(2_000_000, 3072)
    plan = make_plan(rec, WorldSpec(8, 2), get_strategy(preset), 3, 0, 16, memory_cap=1 << 30)
    unit = 0
    sampled = unit_extents(plan, unit)
    assert sampled["scale"] > 1.0  # the sampling is in use here
    got = plan_stats(plan, preset)
    monkeypatch.setattr(pstats, "SAMPLED_WINDOWS", 10**9)
    exact_ex = unit_extents(plan, unit)
    assert exact_ex["scale"] == 1.0
    exact = plan_stats(plan, preset)
    for key in ("ops_per_reader", "bytes_per_reader", "payload_bytes_total"):
        assert got[key] == pytest.approx(exact[key], rel=0.02), key


def test_calibrate_cpu_measures_the_cpu_terms_constants(tmp_path):
    """``dev/calibrate.py DATASET --cpu``: timed warm epochs at three batch sizes give the
    cpu term's constants, printed next to the model's (docs/planner.md, "Calibration")."""
    import math
    import os
    import subprocess
    import sys

    from feedline_tools.make import generate

    pytest.importorskip("mpi4py")  # the script's import (an extra; installed by dev/setup)
    data = generate("cifar10-large", str(tmp_path / "c"), samples=3000, progress=False)
    out = tmp_path / "cpu.json"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [sys.executable, os.path.join(root, "dev", "calibrate.py"), data, "--cpu"]
    proc = subprocess.run([*cmd, "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert set(doc["fit"]) == {"CPU_STEP_S", "CPU_COPY_BW", "DECODE_RECORD_S"} == set(doc["model"])
    assert all(math.isfinite(v) or k == "CPU_COPY_BW" for k, v in doc["fit"].items())
    assert all(v >= 0 for v in doc["fit"].values())
    assert set(doc["epochs_raw_s"]) == {"64", "256", "2048"}
    assert "CPU_STEP_S" in proc.stdout and "model" in proc.stdout
