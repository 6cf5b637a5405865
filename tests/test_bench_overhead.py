# SPDX-License-Identifier: Apache-2.0
"""``feedline bench overhead`` at tiny sizes: pinned to one core, every row delivers the
whole epoch, and the ratios refer to the DataLoader over per-sample preads."""

from __future__ import annotations

import json
import os
import threading

import h5py
import numpy as np
import pytest

from feedline.cli import main
from feedline_tools.bench.overhead import _PreadRows, generate, pin_process, unpin_process


def test_pin_process_pins_every_thread_and_restores():
    cpus = sorted(os.sched_getaffinity(0))
    seen: dict[str, set[int]] = {}
    go, done = threading.Event(), threading.Event()

    def worker():
        go.wait(10)
        seen["thread"] = os.sched_getaffinity(threading.get_native_id())
        done.set()

    t = threading.Thread(target=worker)
    t.start()
    before = pin_process(cpus[-1])
    try:
        go.set()
        assert done.wait(10)
        assert seen["thread"] == {cpus[-1]}  # a thread started before pinning
        assert os.sched_getaffinity(0) == {cpus[-1]}
    finally:
        unpin_process(before)
        t.join()
    assert sorted(os.sched_getaffinity(0)) == cpus


def test_pread_rows_match_h5py(tmp_path):
    path = generate(str(tmp_path / "o.h5"), 100, 30, seed=5)
    import feedline

    with feedline.open_dataset(path) as ds:
        ix = ds.index
        rows = _PreadRows(ix.files[0], int(ix.offsets[0]), 100, len(ix))
        try:
            with h5py.File(path, "r") as f:
                x = f["x"][:]
            for i in (0, 7, 29):
                a, label = rows[i]
                assert a.flags.writeable and label == i % 10
                np.testing.assert_array_equal(a, x[i])
        finally:
            rows.close()


def test_overhead_quick(tmp_path):
    out = tmp_path / "out"
    cpus = sorted(os.sched_getaffinity(0))
    rc = main(
        [
            "bench",
            "overhead",
            "--quick",
            "--plots",
            "--bytes",
            "1M",
            "--batch-size",
            "64",
            "--presets",
            "feedline,async-db",
            "--path",
            str(tmp_path / "d"),
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    assert sorted(os.sched_getaffinity(0)) == cpus
    doc = json.loads((out / "overhead.json").read_text())
    assert doc["core"] == cpus[-1]
    assert [s["sample_bytes"] for s in doc["sizes"]] == [3072, 262144]
    for s in doc["sizes"]:
        assert s["samples"] == max(128, (1 << 20) // s["sample_bytes"])
        rows = {r["name"]: r for r in s["rows"]}
        assert list(rows) == ["feedline", "async-db", "torch-pread", "torch-h5py"]
        assert not any(r["error"] for r in rows.values())
        assert s["baseline"] == "torch-pread"
        assert rows["torch-pread"]["ratio_to_torch"] == pytest.approx(1.0)
        for r in rows.values():
            assert r["samples_per_s"] > 0 and r["cpu_us_per_sample"] > 0
            assert r["ratio_to_torch"] == pytest.approx(
                r["samples_per_s"] / rows["torch-pread"]["samples_per_s"]
            )
    assert (out / "overhead.png").stat().st_size > 0
    assert "CPU us/sample" in (out / "overhead.md").read_text()


def test_overhead_refuses_more_than_one_rank(tmp_path, capsys):
    rc = main(["bench", "overhead", "--quick", "--ranks", "2", "--out", str(tmp_path)])
    assert rc != 0
    assert "one core" in capsys.readouterr().err
    assert not (tmp_path / "overhead.json").exists()


def test_bench_options_refuse_zero_instead_of_defaulting(tmp_path, capsys):
    """A zero size, rank or epoch count is an error naming the option (it used to divide
    by zero, or be replaced by the default and run something else)."""
    rc = main(["bench", "overhead", "--quick", "--sizes", "0", "--out", str(tmp_path)])
    assert rc != 0 and "--sizes" in capsys.readouterr().err
    for argv in (
        ["bench", "deepio", "--quick", "--ranks", "0"],
        ["bench", "deepio", "--quick", "--epochs", "0"],
        ["bench", "deepio", "--quick", "--nodes", "-1"],
        ["bench", "lmdbio", "--quick", "--ranks", "0"],
        ["bench", "async", "--quick", "--nodes", "-1"],
    ):
        with pytest.raises(SystemExit):
            main([*argv, "--out", str(tmp_path)])
        assert f"argument {argv[3]}" in capsys.readouterr().err, argv
