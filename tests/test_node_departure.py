# SPDX-License-Identifier: Apache-2.0
"""The ``node`` source when the ranks of a node do not iterate in lockstep (real mpiexec,
4 ranks on one emulated node, 2 readers): a rank that leaves early never hangs the
others, and a reader's I/O error reaches every rank. See ``tests/mpi/node_departure.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from feedline_tools.bench.harness import mpiexec_command

pytestmark = pytest.mark.mpi
HERE = os.path.dirname(__file__)
N, SIZE, P = 600, 64, 4


def run(scenario: str, tmp_path) -> dict[int, dict]:
    sys.path.insert(0, os.path.join(HERE, "mpi"))
    from loader_common import write_records

    data = tmp_path / "data"
    out = tmp_path / "out"
    out.mkdir()
    write_records(str(data), N, SIZE, 3)
    env = dict(os.environ, FEEDLINE_POLL_SLEEP_US="500", OMP_NUM_THREADS="1", FEEDLINE_NODES="1")
    cmd = [
        mpiexec_command(),
        "-n",
        str(P),
        sys.executable,
        os.path.join(HERE, "mpi", "node_departure.py"),
        scenario,
        str(data),
        str(N),
        str(SIZE),
        str(out),
    ]
    # a regression (a hang) fails here instead of hanging CI
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    res = {}
    for r in range(P):
        with open(out / f"rank{r}.json") as f:
            res[r] = json.load(f)
    for r, x in res.items():
        assert not (x["raised"] or "").startswith("UNEXPECTED"), x["message"]
        assert x["errors"] == [], (r, x["errors"][:3])  # every delivered record was right
    return res


def full(x: dict, epoch: int) -> bool:
    return x["steps"].get(str(epoch)) == list(range(x["len"]))


def test_all_ranks_break_at_the_same_step_then_run_new_epochs(tmp_path):
    res = run("all-break", tmp_path)
    for x in res.values():
        assert x["raised"] is None
        assert x["steps"]["0"] == [0, 1, 2, 3]
        assert full(x, 1) and full(x, 2)
        assert x["node_syncs"] > 3  # several windows per epoch


def test_a_peer_that_breaks_and_closes_leaves_the_others_their_data(tmp_path):
    res = run("peer-break", tmp_path)
    assert res[P - 1]["steps"]["0"] == [0, 1, 2] and res[P - 1]["reader"] is False
    for r in range(P - 1):
        assert res[r]["raised"] is None and full(res[r], 0)
    assert res[P - 1]["close_s"] < 10


@pytest.mark.parametrize("scenario", ["reader-break", "reader-break-slow"])
def test_a_reader_that_breaks_keeps_reading_for_the_node(tmp_path, scenario):
    """rank 0 (a reader) leaves epoch 0 at step 2 and starts epoch 1 at once: the others
    still get every record of epoch 0 (rank 0 reads its share for them), then all run 1.

    ``reader-break-slow`` holds rank 0 for 0.3 s between writing epoch 1's key and
    publishing that it entered that pass: the others, still in epoch 0, must not take the
    departed rank's new key for a rank out of step (they raised NodeOutOfStepError here,
    every run, and in about 1 run in 3 of ``reader-break``)."""
    res = run(scenario, tmp_path)
    assert res[0]["reader"] is True and res[0]["steps"]["0"] == [0, 1, 2]
    for r in range(P):
        assert res[r]["raised"] is None and full(res[r], 1), (r, res[r])
        if r:
            assert full(res[r], 0)


def test_a_late_read_of_a_pass_left_never_lands_in_the_next(tmp_path):
    """rank 2 (the second reader) leaves epoch 0 at step 3 and serves the others; its read
    of the epoch's last window lands late, once they all left epoch 0 in the window
    before. The next pass reuses the same halves with another layout: no reader may read
    into them before every reader's older reads are over (before: rank 0's part of
    epoch 1's second window was overwritten, wrong bytes on ranks 0 and 1, every run)."""
    res = run("late-read", tmp_path)
    assert res[2]["steps"]["0"] == [0, 1, 2, 3]
    assert res[2]["late"] == [True]  # one late read, landed after every rank left epoch 0
    for r in range(P):
        assert res[r]["raised"] is None, (r, res[r])
        assert full(res[r], 1) and full(res[r], 2)
        if r != 2:
            assert res[r]["flag"] is True and res[r]["windows"] > 3
            assert res[r]["steps"]["0"][-1] < res[r]["len"] - 1


def test_a_new_loader_starts_from_a_clean_node_window(tmp_path):
    """Every rank runs epochs 0 and 1, closes, and runs them again with a new Loader whose
    node window starts with the old window's bytes (MPI does not zero a new window, and
    with one rank per node MPICH hands back a freed one's memory): the old control words
    said pass 2 had read every window, so the new pass 1 raised NodeOutOfStepError at
    once (every run; in the conformance suite's one-rank-per-node case, 1 run in 14).
    The window's control block is zeroed at allocation."""
    res = run("reopen", tmp_path)
    for r in range(P):
        x = res[r]
        assert x["raised"] is None, (r, x)
        assert x["steps"]["0"] == list(range(x["len"])) * 2
        assert x["steps"]["1"] == list(range(x["len"])) * 2
        assert x["node_syncs_first"] > 3


def test_a_reader_that_closes_serves_the_node_until_the_epoch_ends(tmp_path):
    res = run("reader-close", tmp_path)
    assert res[0]["steps"]["0"] == [0, 1, 2]
    for r in range(1, P):
        assert res[r]["raised"] is None and full(res[r], 0)


def test_a_reader_gone_for_good_is_a_typed_error_not_a_hang(tmp_path):
    """rank 0 closes while the others stall longer than it waits (STALL_S=1.5 s): its
    close returns, and the others raise NodePeerLeft naming rank 0 at the first window it
    did not read, after delivering correct data up to there."""
    res = run("reader-gone", tmp_path)
    assert res[0]["raised"] is None and res[0]["close_s"] < 10
    for r in range(1, P):
        x = res[r]
        assert x["raised"] == "NodePeerLeft", x
        assert "rank 0 of node 0" in x["message"]
        assert 2 < x["at"] < x["len"] - 1


def test_a_reader_io_error_mid_epoch_is_raised_on_every_rank(tmp_path):
    """rank 0 truncates every data file after step 1: the readers' next reads fail and
    every rank raises the same typed error at the same step (nobody hangs or gets
    other bytes)."""
    res = run("io-error", tmp_path)
    kinds = {x["raised"] for x in res.values()}
    assert len(kinds) == 1 and kinds != {None}, res
    assert kinds <= {"StorageError", "CorruptDataError"}, kinds
    assert len({x["at"] for x in res.values()}) == 1, {r: x["at"] for r, x in res.items()}


def test_ranks_out_of_step_raise_instead_of_mixing_epochs(tmp_path):
    """rank 0 starts (and drops) one pass more than the others, so its pass numbers
    mean other epochs: the others still finish epoch 0 (rank 0 reads it for them), then
    every rank raises NodeOutOfStepError — no rank gets another epoch's records."""
    res = run("extra-pass", tmp_path)
    for r, x in res.items():
        assert x["raised"] == "NodeOutOfStepError", (r, x)
        if r:
            assert full(x, 0)
