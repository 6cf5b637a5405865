# SPDX-License-Identifier: Apache-2.0
"""``feedline bench lmdbio --quick``: every preset side by side under mpiexec, artefacts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from feedline_tools.bench.lmdbio import PRESETS


@pytest.mark.mpi
def test_quick_smoke(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, FEEDLINE_POLL_SLEEP_US="500", OMP_NUM_THREADS="1")
    env.pop("FEEDLINE_NODES", None)
    cmd = [sys.executable, "-m", "feedline", "bench", "lmdbio", "--quick", "--plots", "--ranks", "4",
           "--nodes", "2", "--out", str(out), "--json", str(tmp_path / "doc.json")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "doc.json").read_text())
    assert doc["scenario"] == "lmdbio" and doc["baseline"] == "lmdb"
    assert [r["name"] for r in doc["runs"]] == [*PRESETS, "feedline"]  # the ladder, then ours
    assert doc["limit_MBps"] and doc["limit_MBps"] > 0
    by = {r["name"]: r for r in doc["runs"]}
    assert all(r["error"] is None and r["ranks"] == 4 and r["nodes"] == 2 for r in by.values())
    assert by["lmdb"]["ratio_to_baseline"] == pytest.approx(1.0)
    # presets with the same order deliver the same bytes (digest over rank, step, ids, bytes)
    strided = {by[p]["digest"] for p in ("lmdb", "lmm", "lmm-dm", "lmm-dio", "lmm-dio-prov")}
    assert len(strided) == 1 and None not in strided
    assert by["lmm-dio-prov-coal"]["digest"] == by["lmm-dio-prov-coal-stag"]["digest"]
    assert by["skip"]["digest"] != by["lmdb"]["digest"]
    rows = {r["preset"]: r for r in doc["lmdbio"]}
    assert rows["lmdb"]["readers"] == 4 and rows["lmm"]["readers"] == 2
    assert rows["lmm-dio-prov"]["seek_s"] == 0 and rows["lmm-dio"]["seek_s"] > 0
    # the same bytes as the first run of the same order; feedline's order is its own
    assert rows["lmdb"]["same_bytes_as_same_order"] is True
    assert all(r["same_bytes_as_same_order"] is not False for r in rows.values())
    assert rows["feedline"]["same_bytes_as_same_order"] is None
    # every rank of feedline's direct plan reads its own share; LMDB's page overhead is
    # read through (what storage gave beyond the payload)
    fl = by["feedline"]
    assert rows["feedline"]["readers"] == 4 and rows["feedline"]["io_s"] is not None
    st = fl["stats"]
    assert rows["feedline"]["redundant_bytes"] == sum(st["storage_bytes"]) - sum(
        st["payload_bytes"]
    )
    assert rows["lmm-dm"]["spec_extra_bytes"] >= 0 and rows["lmdb"]["ctx_switches"] > 0
    # the limit's time to read the files over each run's time, beside the payload rate
    lim = doc["limit"]
    assert lim["seconds"] > 0 and lim["bytes"] >= sum(r["payload_bytes"] for r in doc["runs"][:1])
    for r in rows.values():
        assert r["files_vs_limit"] == pytest.approx(lim["seconds"] / r["time_s"])
    summary = (out / "lmdbio-summary.md").read_text()
    assert "| lmm-dio-prov-coal-stag |" in summary and "best:" in summary
    assert "files vs limit" in summary
    for plot in ("time", "breakdown", "ctx_switches"):
        assert (out / f"lmdbio-{plot}.png").stat().st_size > 1000
