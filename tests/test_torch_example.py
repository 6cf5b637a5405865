# SPDX-License-Identifier: Apache-2.0
"""examples/train_torch.py runs under mpiexec -n 2 and resumes mid-epoch exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
from feedline_tools.bench.harness import mpiexec_command

pytestmark = pytest.mark.mpi
EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "train_torch.py")


def run(tmp_path, *args):
    env = dict(os.environ, OMP_NUM_THREADS="1", FEEDLINE_POLL_SLEEP_US="500")
    env.pop("FEEDLINE_NODES", None)
    cmd = [
        mpiexec_command(),
        "-n",
        "2",
        sys.executable,
        EXAMPLE,
        "--data",
        str(tmp_path / "cifar"),
        "--samples",
        "96",
        "--batch",
        "16",
        "--epochs",
        "2",
        "--checkpoint",
        str(tmp_path / "ck.pt"),
        "--log",
        str(tmp_path / "ids.jsonl"),
        *args,
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    return p.stdout


def test_train_stop_and_resume(tmp_path):
    out = run(tmp_path, "--stop-after", "4")
    assert "stopped after 4 steps" in out
    out = run(tmp_path, "--resume")
    assert "resumed at epoch 0 step 4" in out and "epoch 1:" in out
    rows = [json.loads(line) for line in (tmp_path / "ids.jsonl").read_text().splitlines()]
    assert [(r["epoch"], r["step"]) for r in rows] == [(e, s) for e in (0, 1) for s in range(6)]
    for epoch in (0, 1):  # across the preemption, every sample once per epoch
        ids = sorted(i for r in rows if r["epoch"] == epoch for part in r["ids"] for i in part)
        assert ids == list(range(96))
