# SPDX-License-Identifier: Apache-2.0
"""The harness on the storage emulator: caches dropped through its control file before
every run, per-node request counters in the stats."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from feedline_tools.bench import limit
from feedline_tools.bench.readers import generate

pytestmark = [pytest.mark.fuse, pytest.mark.mpi]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fuse_binary() -> str | None:
    found = os.environ.get("FEEDLINE_FUSE") or shutil.which("feedline-fuse")
    if found:
        return found
    built = sorted(glob.glob(os.path.join(ROOT, "build", "*", "cpp", "feedline-fuse")))
    return built[0] if built else None


@pytest.fixture
def emulator(tmp_path):
    binary = _fuse_binary()
    if binary is None or not os.path.exists("/dev/fuse") or os.geteuid() != 0:
        pytest.skip("needs the feedline-fuse emulator binary, /dev/fuse and root")
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    mnt.mkdir()
    generate(str(src / "r.bin"), 2 << 20, 3072, seed=2)
    proc = subprocess.Popen(
        [binary, str(src), str(mnt), "--nodes", "2", "--latency-us", "50"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        if not line.startswith("ready"):
            pytest.skip(f"emulator did not start: {line!r} {proc.stderr.read()[:300]!r}")
        yield str(mnt)
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False, capture_output=True)
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_runs_start_cold_on_every_emulated_node(emulator, tmp_path):
    path = os.path.join(emulator, "node{node}", "r.bin")
    node1 = path.replace("{node}", "1")
    assert limit.emulator_for(node1) is not None and limit.emulator_node(node1) == 1
    assert limit.emulator_for(str(tmp_path)) is None
    out = tmp_path / "r.json"
    cmd = [
        sys.executable,
        "-m",
        "feedline",
        "bench",
        "readers",
        "--quick",
        "--ranks",
        "2",
        "--nodes",
        "2",
        "--path",
        path,
        "--repeats",
        "2",
        "--no-plots",
        "--json",
        str(out),
        "--out",
        str(tmp_path / "out"),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stderr
    with open(out) as f:
        doc = json.load(f)
    assert doc["limit_MBps"] > 0 and len({r["digest"] for r in doc["runs"]}) == 1
    for r in doc["runs"]:
        emu = r["stats"]["emulator"]
        for rank in range(2):
            # every run of every repeat reads its whole share from the emulated servers:
            # with a warm node cache it would read (almost) nothing
            assert emu[rank]["bytes"] >= r["stats"]["payload_bytes"][rank] > 0
            assert emu[rank]["requests"] > 0
