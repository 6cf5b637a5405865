# SPDX-License-Identifier: Apache-2.0
"""World: single-process behaviour in-process, MPI behaviour under real mpiexec."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from feedline.dist import World, launched_by_mpi
from feedline.errors import ConfigError, CorruptDataError
from feedline.plan import FlatRecords, get_strategy, make_plan

HERE = os.path.dirname(__file__)
MPIEXEC = shutil.which("mpiexec")


def run_mpi(
    n: int, script: str, *args: str, timeout: float = 120, nodes_env: int | None = None
) -> str:
    env = dict(os.environ, FEEDLINE_POLL_SLEEP_US="500", OMP_NUM_THREADS="1")
    env.pop("FEEDLINE_NODES", None)
    if nodes_env is not None:
        env["FEEDLINE_NODES"] = str(nodes_env)
    proc = subprocess.run(
        [MPIEXEC, "-n", str(n), sys.executable, os.path.join(HERE, "mpi", script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc.stdout


def test_single_process_world(monkeypatch):
    for v in (
        "PMI_SIZE",
        "PMI_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "PMIX_RANK",
        "MPI_LOCALNRANKS",
        "WORLD_SIZE",
    ):
        monkeypatch.delenv(v, raising=False)
    assert not launched_by_mpi()
    w = World.from_comm()
    assert (w.rank, w.size, w.node, w.nodes, w.node_rank, w.is_leader) == (0, 1, 0, 1, 0, True)
    assert w.comm is None and w.spec.size == 1
    w.barrier()
    assert w.bcast({"a": 1}) == {"a": 1}
    assert w.allgather(5) == [5]
    assert w.bcast_seed(9) == 9 and isinstance(w.bcast_seed(), int)
    assert w.expand_path("/x/node{node}") == "/x/node0"
    shm = w.node_array((3, 2), np.float32)
    assert shm.array.shape == (3, 2) and shm.array.dtype == np.float32
    shm.free()
    calls = []
    assert w.share_index(lambda: calls.append(1) or "idx") == "idx" and calls == [1]
    with pytest.raises(CorruptDataError):
        w.share_index(lambda: (_ for _ in ()).throw(CorruptDataError("f", 1, "bad")))
    plan = make_plan(
        FlatRecords(10, 4), w.spec, get_strategy("lmm-dio-prov-coal-stag"), batch_size=2
    )
    tok = w.token(plan.stagger(0))
    for _ in range(3):
        with tok:
            pass
    tok.close()


def test_torchrun_without_mpi_refuses(monkeypatch):
    for v in ("PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ConfigError, match="torchrun"):
        World.from_comm()


pytestmark_mpi = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not installed")


@pytestmark_mpi
@pytest.mark.mpi
@pytest.mark.parametrize(("n", "nodes"), [(1, 0), (2, 0), (4, 2), (8, 3)])
def test_world_under_mpiexec(n, nodes):
    assert "OK world" in run_mpi(n, "world_checks.py", str(nodes))


@pytestmark_mpi
@pytest.mark.mpi
def test_world_nodes_from_environment():
    assert "OK world" in run_mpi(4, "world_checks.py", "env", nodes_env=4)


@pytestmark_mpi
@pytest.mark.mpi
@pytest.mark.full
@pytest.mark.parametrize(("n", "nodes"), [(4, 0), (8, 8), (8, 0)])
def test_world_under_mpiexec_more(n, nodes):
    assert "OK world" in run_mpi(n, "world_checks.py", str(nodes))


@pytestmark_mpi
@pytest.mark.mpi
@pytest.mark.parametrize(
    ("n", "nodes", "mode"),
    [
        (1, 0, "sidecar"),
        (4, 2, "sidecar"),
        (4, 2, "nosidecar"),
        (4, 2, "fail"),
        (4, 2, "failother"),
        (4, 2, "failload"),
        (2, 0, "failload"),
    ],
)
def test_share_index_under_mpiexec(tmp_path, n, nodes, mode):
    assert f"OK share_index {n} {nodes} {mode}" in run_mpi(
        n, "share_index.py", str(tmp_path), str(nodes), mode
    )


def test_a_store_batch_of_a_few_records_is_copied_directly():
    """``copy_few``: records of this rank's part and of same-host parts (shared memory)
    copied one by one, bytes counted by node; None (nothing copied) as soon as one record
    lies in a part only MPI can reach."""
    from feedline.dist.shm import copy_few

    rng = np.random.default_rng(5)
    parts = [rng.integers(0, 256, 1000, dtype=np.uint8) for _ in range(4)]
    node = np.array([0, 0, 1, 1])
    owners = np.array([2, 0, 1, 2, 1, 0])
    disps = np.array([10, 500, 0, 900, 300, 7])
    lengths = np.array([5, 100, 0, 100, 64, 1])
    dest = np.concatenate([[0], np.cumsum(lengths[:-1])])
    out = np.zeros(int(lengths.sum()), np.uint8)
    # rank 0: its own part, rank 1 (same node), rank 2 (another node, same host)
    got = copy_few(parts[0], parts, 0, node, owners, disps, lengths, out, dest)
    want = np.concatenate(
        [parts[o][d : d + n] for o, d, n in zip(owners, disps, lengths, strict=True)]
    )
    assert np.array_equal(out, want)
    # other ranks read: 1 (64 B; its 0-length record alone would not count) and 2
    assert got == (64, 105, 2)
    # a part not in shared memory: nothing copied, the caller goes through MPI
    out[:] = 0
    shared = [parts[0], None, parts[2], parts[3]]
    assert copy_few(parts[0], shared, 0, node, owners, disps, lengths, out, dest) is None
    assert not out.any()
