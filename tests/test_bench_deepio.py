# SPDX-License-Identifier: Apache-2.0
"""``feedline bench deepio --quick`` (the CI smoke test of the DeepIO scenario)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.mpi


def test_bench_deepio_quick(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("FEEDLINE_NODES", None)
    p = subprocess.run(
        [sys.executable, "-m", "feedline", "bench", "deepio", "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    doc = json.loads((out / "deepio.json").read_text())
    c = doc["config"]
    assert c["ranks"] == 2 and c["quick"]
    modes = {(r["element"], r["mode"]) for r in doc["fig9"]}
    assert modes == {(L, m) for L in c["sizes"] for m in ("seq", "ordered", "opportunistic")}
    for r in doc["fig9"] + doc["fig10"]:
        assert r["MBps"] > 0 and r["bytes"] > 0
    # the opportunistic mode serves from the rank's own memory: no gets at all here
    for L in c["sizes"]:
        opp = next(r for r in doc["fig9"] if r["element"] == L and r["mode"] == "opportunistic")
        ordd = next(r for r in doc["fig9"] if r["element"] == L and r["mode"] == "ordered")
        assert opp["rma_gets"] < ordd["rma_gets"] and opp["local_bytes"] == opp["bytes"]
    assert {r["R"] for r in doc["fig13"]} == {0.0, 0.25, 0.5, 1.0}
    assert all(r["s"] > 0 and r["steps"] > 0 for r in doc["fig13"])
    assert {(r["storage"], r["api"]) for r in doc["table1"]} >= {
        ("tmpfs", "deepio.batch"),
        ("tmpfs", "torch DataLoader"),
    }
    rl = {r["R"]: r for r in doc["rl"]}
    assert rl[0.5]["ordered"] == pytest.approx(0.9854, abs=5e-5)
    assert rl[0.25]["ordered"] == pytest.approx(0.9696, abs=5e-5)
    for name in ("fig9", "fig10", "fig13"):
        assert (out / f"deepio-{name}.png").stat().st_size > 1000
    md = (out / "deepio.md").read_text()
    assert "## Fig. 13" in md
    assert "| column | what it does | shuffles? |" in md and "| seq (FS, cold) |" in md
