# SPDX-License-Identifier: Apache-2.0
"""The harness under real MPI: launched by ``--ranks N --nodes M``, and started by mpiexec."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from feedline.plan.world import WorldSpec
from feedline_tools.bench import report
from feedline_tools.bench.digest import digest_of
from feedline_tools.bench.harness import mpiexec_command
from feedline_tools.bench.readers import generate
from feedline_tools.bench.runners import assignment

pytestmark = pytest.mark.mpi
REC = 3072  # the readers scenario's default record
BATCH = 1024


def _expected(paths_by_rank: list[str]) -> str:
    deliveries = []
    ranks = len(paths_by_rank)
    for r, path in enumerate(paths_by_rank):
        with open(path, "rb") as f:
            data = f.read()
        n = len(data) // REC
        deliveries.append(
            [
                (s, ids, [REC] * len(ids), b"".join(data[i * REC : (i + 1) * REC] for i in ids))
                for s, ids in enumerate(assignment("contiguous", n, BATCH, r, ranks))
            ]
        )
    return digest_of(deliveries)


def _bench(cmd_prefix: list[str], tmp_path, *argv: str, env=None) -> subprocess.CompletedProcess:
    cmd = [
        *cmd_prefix,
        sys.executable,
        "-m",
        "feedline",
        "bench",
        "readers",
        "--quick",
        "--out",
        str(tmp_path / "out"),
        "--json",
        str(tmp_path / "r.json"),
        *argv,
    ]
    return subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, **(env or {})),
        check=False,
    )


def _have_loader() -> bool:
    try:
        import feedline.loader  # noqa: F401
    except ImportError:
        return False
    return True


def _doc(tmp_path):
    with open(tmp_path / "r.json") as f:
        return json.load(f)


def test_harness_launches_ranks_on_emulated_nodes(tmp_path):
    # node 1 sees different bytes than node 0, so the digest proves {node} expansion
    node1 = generate(str(tmp_path / "n1" / "r.bin"), 4 << 20, REC, seed=9)
    extra = ["--presets", "contiguous"] if _have_loader() else []
    p = _bench(
        [],
        tmp_path,
        "--ranks",
        "2",
        "--nodes",
        "2",
        "--path",
        str(tmp_path / "n{node}" / "r.bin"),
        *extra,
    )
    assert p.returncode == 0, p.stderr
    doc = _doc(tmp_path)
    node0 = str(tmp_path / "n0" / "r.bin")
    assert os.path.exists(node0)
    assert len(doc["runs"]) == 5 + len(extra) // 2
    for r in doc["runs"]:
        assert (r["ranks"], r["nodes"]) == (2, 2)
        assert r["stats"]["node"] == [0, 1]
        assert r["error"] is None and len(r["stats"]["time_s"]) == 2
        assert min(r["stats"]["skew_s"]) == 0.0
    assert {r["digest"] for r in doc["runs"]} == {_expected([node0, node1])}
    assert doc["limit_MBps"] > 0
    assert f"| per-sample | {report.ROWS['per-sample']} | no | 2 | 2 |" in p.stdout


def test_started_under_mpiexec(tmp_path):
    data = generate(str(tmp_path / "d" / "r.bin"), 2 << 20, REC, seed=4)
    world = WorldSpec(3, 1)
    p = _bench(
        [mpiexec_command(), "-n", "3"],
        tmp_path,
        "--path",
        data,
        "--no-plots",
        env={"FEEDLINE_NODES": "1"},
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("### readers") == 1  # only rank 0 reports
    doc = _doc(tmp_path)
    assert all(r["ranks"] == world.size and r["nodes"] == 1 for r in doc["runs"])
    assert {r["digest"] for r in doc["runs"]} == {_expected([data] * 3)}
    assert not any(f.endswith(".png") for f in os.listdir(tmp_path / "out"))


def test_ranks_must_match_the_job_it_runs_in(tmp_path):
    data = generate(str(tmp_path / "d" / "r.bin"), 1 << 20, REC)
    p = _bench([mpiexec_command(), "-n", "2"], tmp_path, "--path", data, "--ranks", "3")
    assert p.returncode != 0
    assert "--ranks 3 but this job has 2 ranks" in p.stderr
