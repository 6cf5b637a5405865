# SPDX-License-Identifier: Apache-2.0
"""``feedline bench async`` at tiny sizes: every row runs, deliveries match the papers'
orders byte for byte (digest from h5py and the planner), and the tables add up."""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest

from feedline.cli import main
from feedline_tools.bench.async_bench import QUICK
from feedline_tools.bench.digest import digest_of
from feedline_tools.bench.runners import assignment


def _digest_from_files(path: str, batch: int, ranks: int, kind: str, epochs: int = 1) -> str:
    """The digest of *kind*'s order over the rows of the HDF5 files, computed with h5py
    alone (files sorted by name, rows in file order); epoch e's steps are numbered on
    from epoch e-1's."""
    rows = []
    for f in sorted(p for p in os.listdir(path) if p.endswith(".h5")):
        with h5py.File(os.path.join(path, f), "r") as h:
            rows += [r.tobytes() for r in h["x"][:]]
    deliveries = []
    for r in range(ranks):
        steps = []
        for e in range(epochs):
            order = assignment(kind, len(rows), batch, r, ranks, epoch=e)
            for s, ids in enumerate(order):
                raw = b"".join(rows[i] for i in ids)
                steps.append((e * len(order) + s, ids, [len(rows[i]) for i in ids], raw))
        deliveries.append(steps)
    return digest_of(deliveries)


def _run(tmp_path, *extra: str) -> dict:
    out = tmp_path / "out"
    rc = main(
        [
            "bench",
            "async",
            "--quick",
            "--plots",
            "--path",
            str(tmp_path / "data"),
            "--keep-data",
            "--out",
            str(out),
            *extra,
        ]
    )
    assert rc == 0
    with open(out / "async.json") as f:
        return json.load(f)


def test_async_quick_tables_digests_and_sweep(tmp_path):
    doc = _run(tmp_path)
    out = tmp_path / "out"
    for name in ("async.md", "async-breakdown.png", "async-buffer-sweep.png"):
        assert (out / name).stat().st_size > 0
    assert set(doc["datasets"]) == {"cosmoflow", "neuron-inverter"}
    for name, e in doc["datasets"].items():
        rows = {r["name"]: r for r in e["rows"]}
        assert list(rows) == [
            "tf",
            "tf-pre",
            "async",
            "async-db",
            "feedline",
            "torch-w0",
            "torch-w2",
        ]
        assert not any(r["error"] for r in rows.values())
        # compute auto: 1.2 x the measured async read time per step
        cal = e["calibration"]
        assert e["compute_ms"] == pytest.approx(1.2 * cal["read_ms_per_step"])
        # measured over as many epochs as the rows, the page cache emptied the same way
        assert cal["epochs"] == e["epochs"]
        for r in rows.values():
            assert r["compute_s"] == pytest.approx(e["steps"] * e["compute_ms"] / 1e3)
            assert 0 <= r["first_wait_s"] <= r["exposed_io_s"] <= r["total_s"]
            # sleeping never takes less than asked; start-up, waits and sleeps fit the epoch
            assert r["compute_actual_s"] >= r["compute_s"] * 0.999
            parts = r["exposed_io_s"] + r["compute_actual_s"] + r["startup_s"]
            assert parts <= r["total_s"] * 1.001
            assert r["other_s"] == pytest.approx(r["total_s"] - parts, abs=1e-6)
            # stalls: the waits beyond the median wait (so at most the exposed time)
            assert 0 <= r["stall_s"] <= r["exposed_io_s"]
            assert 0 <= r["median_wait_ms"] / 1e3 <= r["exposed_io_s"]
        # same order => same bytes: tf's global shuffle for the tf rows and the
        # DataLoader peers; the async presets share their chunk order
        want = _digest_from_files(str(tmp_path / "data" / name), QUICK[name].batch_size, 1, "tf")
        for n in ("tf", "tf-pre", "torch-w0", "torch-w2"):
            assert rows[n]["digest"] == want, n
        assert rows["async"]["digest"] == rows["async-db"]["digest"] != want
        # the default reads its own plan: every sample once, in its own order
        assert rows["feedline"]["digest"] not in (want, rows["async"]["digest"])
        # one read per sample for tf, one per group (B samples) for the async presets
        shape = QUICK[name]
        assert rows["tf"]["storage_ops"] == shape.samples
        assert rows["async-db"]["storage_ops"] < shape.samples
        # sweep: a bigger buffer means fewer group reads
        ops = [r["storage_ops"] for r in sorted(e["sweep"], key=lambda r: r["buffer_samples"])]
        assert len(ops) == 2 and ops[0] > ops[1]
        assert e["summary"]["vs"]["tf"]["exposed_ratio"] > 0
    md = (out / "async.md").read_text()
    assert "async-db exposed I/O" in md and "buffer sweep" in md


def test_async_two_ranks_fixed_compute(tmp_path):
    doc = _run(
        tmp_path,
        "--ranks",
        "2",
        "--datasets",
        "neuron-inverter",
        "--compute",
        "2",
        "--torch-workers",
        "0",
        "--sweep",
        "",
        "--no-plots",
    )
    e = doc["datasets"]["neuron-inverter"]
    assert e["ranks"] == 2 and e["compute_ms"] == 2.0 and "calibration" not in e
    assert "sweep" not in e
    rows = {r["name"]: r for r in e["rows"]}
    assert list(rows) == ["tf", "tf-pre", "async", "async-db", "feedline", "torch-w0"]
    want = _digest_from_files(
        str(tmp_path / "data" / "neuron-inverter"), QUICK["neuron-inverter"].batch_size, 2, "tf"
    )
    assert rows["tf"]["digest"] == rows["torch-w0"]["digest"] == want
    assert rows["async"]["digest"] == rows["async-db"]["digest"]
    assert np.isfinite(e["summary"]["async_db_exposed_pct"])


def test_async_real_model_as_compute(tmp_path):
    doc = _run(
        tmp_path,
        "--datasets",
        "neuron-inverter",
        "--compute",
        "model",
        "--torch-workers",
        "0",
        "--sweep",
        "",
        "--no-plots",
    )
    e = doc["datasets"]["neuron-inverter"]
    assert e["compute"] == "model" and e["compute_ms"] == 0.0 and "calibration" not in e
    rows = {r["name"]: r for r in e["rows"]}
    want = _digest_from_files(
        str(tmp_path / "data" / "neuron-inverter"), QUICK["neuron-inverter"].batch_size, 1, "tf"
    )
    assert rows["tf"]["digest"] == rows["torch-w0"]["digest"] == want
    for r in rows.values():
        assert r["error"] is None
        assert r["compute_actual_s"] > 0  # a real training step ran after every batch
        assert r["exposed_io_s"] + r["compute_actual_s"] <= r["total_s"] * 1.001


def test_async_epochs_average_and_follow_each_epochs_order(tmp_path):
    """--epochs 2: every row delivers epoch 0 then epoch 1 in that epoch's order (the
    DataLoader peer too), and the table is per average epoch."""
    doc = _run(
        tmp_path,
        "--ranks",
        "2",
        "--datasets",
        "cosmoflow",
        "--compute",
        "1",
        "--epochs",
        "2",
        "--torch-workers",
        "0",
        "--sweep",
        "",
        "--no-plots",
    )
    e = doc["datasets"]["cosmoflow"]
    assert e["epochs"] == 2
    rows = {r["name"]: r for r in e["rows"]}
    want = _digest_from_files(
        str(tmp_path / "data" / "cosmoflow"), QUICK["cosmoflow"].batch_size, 2, "tf", epochs=2
    )
    assert rows["tf"]["digest"] == rows["tf-pre"]["digest"] == rows["torch-w0"]["digest"] == want
    assert rows["async"]["digest"] == rows["async-db"]["digest"] != want
    for r in rows.values():
        assert r["epochs"] == 2 and r["later_first_wait_s"] is not None
        # the second epoch's own exposed share: a percentage, at least its first wait's
        assert 0 <= r["later_exposed_pct"] < 100
        assert r["later_exposed_pct"] > 0 or r["later_first_wait_s"] == 0
        assert r["compute_s"] == pytest.approx(e["steps"] * 1e-3)  # per epoch
        assert r["compute_actual_s"] >= r["compute_s"] * 0.999
        assert 0 <= r["exposed_io_s"] <= r["total_s"]
    # per-epoch read ops: one per sample for tf
    assert rows["tf"]["storage_ops"] == QUICK["cosmoflow"].samples
    md = (tmp_path / "out" / "async.md").read_text()
    assert "averaged over 2 epoch(s)" in md and "exposed %, later" in md
