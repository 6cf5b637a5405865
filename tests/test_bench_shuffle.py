# SPDX-License-Identifier: Apache-2.0
"""``feedline bench shuffle`` at tiny sizes: RL of every plan, a real (tiny) training run
per order, and DeepIO's calibration checkpoints."""

from __future__ import annotations

import json

import numpy as np
import pytest

from feedline.cli import main
from feedline.plan import WorldSpec
from feedline_tools.bench.shuffle import PAPER_GROUPS, PAPER_MEMORY, class_mix, epoch_order, orders


def test_orders_are_permutations_and_class_mix_orders_them():
    n, batch, classes = 600, 60, 10
    labels = np.repeat(np.arange(classes), n // classes)  # class-sorted, as on disk
    mix = {}
    for name, strat in orders([20], [0.25]):
        o = epoch_order(n, WorldSpec(3, 1), strat, 0, 0, batch)
        assert np.array_equal(np.sort(o), np.arange(n)), name
        mix[name] = class_mix(o, labels, batch, classes)
    assert mix["none"] == pytest.approx(0.0, abs=0.05)  # a batch = one class (+ a border)
    assert mix["global"] > 0.85
    assert mix["none"] < mix["chunk B=20"] < mix["global"]
    assert class_mix(np.arange(n), labels, n, classes) == pytest.approx(1.0)


def test_shuffle_quick(tmp_path):
    out = tmp_path / "out"
    rc = main(
        ["bench", "shuffle", "--quick", "--plots", "--path", str(tmp_path / "c"), "--out", str(out)]
    )
    assert rc == 0
    doc = json.loads((out / "shuffle.json").read_text())
    assert doc["samples"] == 400 and doc["test_samples"] == 40
    rows = {r["order"]: r for r in doc["rows"]}
    assert list(rows) == [
        "global",
        "feedline",
        "chunk B=64",
        "memory R=0.5",
        "memory R=0.25",
        "memory R=0.1",
        "none",
    ]
    assert rows["global"]["rl"] == 1.0 and rows["none"]["rl"] == 0.0
    assert rows["none"]["rl_observed"] == 0.0
    assert 0 < rows["chunk B=64"]["rl"] < 1
    assert rows["memory R=0.1"]["rl"] < rows["memory R=0.25"]["rl"] < rows["memory R=0.5"]["rl"]
    assert 0 < rows["feedline"]["rl"] < 1  # planned over the index: the preset's tiles
    for name in ("global", "feedline", "chunk B=64", "none"):  # trained
        assert 0.0 <= rows[name]["accuracy"] <= 1.0 and np.isfinite(rows[name]["loss"])
    for name in ("memory R=0.5", "memory R=0.25", "memory R=0.1"):  # RL only with --quick
        assert rows[name]["accuracy"] is None
    assert rows["global"]["class_mix"] > rows["none"]["class_mix"]
    # DeepIO's checkpoints, at the planner's Caltech-101-sized N (docs/planner.md)
    cal = {c["case"]: c for c in doc["calibration"]}
    for g, paper in PAPER_GROUPS.items():
        assert cal[f"constant groups of {g}"]["feedline"]["7664"] == pytest.approx(paper, abs=0.01)
    for r, paper in PAPER_MEMORY.items():
        got = cal[f"memory R={r:g}"]["feedline"]["7664"]
        assert got == pytest.approx(paper, abs=0.0005)
    assert (out / "shuffle.png").stat().st_size > 0
    md = (out / "shuffle.md").read_text()
    assert "RL calibration" in md
    # every row of the table has the header's cells, the two diagnostics among them
    table = [ln for ln in md.splitlines() if ln.startswith("| ")]
    head = table[0].split(" | ")
    assert "classes per batch" in head and "corr. with disk order" in head
    for line in table[1 : 1 + len(rows)]:
        assert line.count("|") == table[0].count("|"), line
    cpb = head.index("classes per batch")
    none_row = next(ln for ln in table if ln.startswith("| none |")).split(" | ")
    assert float(none_row[cpb]) == pytest.approx(rows["none"]["classes_per_batch"], abs=0.01)
    assert rows["global"]["classes_per_batch"] > rows["none"]["classes_per_batch"]
    assert abs(rows["none"]["disk_correlation"]) > 0.9 > abs(rows["global"]["disk_correlation"])
