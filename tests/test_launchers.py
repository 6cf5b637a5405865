# SPDX-License-Identifier: Apache-2.0
"""One launcher detector (feedline.dist.launch.detect) and everything that agrees with it.

Each launcher's environment is monkeypatched and MPI is a stand-in module, so nothing
here starts MPI in the pytest process; two subprocess checks do it for real (mpiexec -n 2,
and a "srun without PMI" process whose MPI sees one rank).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import types

import pytest

from feedline.dist import World
from feedline.dist import launched_by_mpi as dist_launched_by_mpi
from feedline.dist.launch import (
    KINDS,
    Launch,
    LaunchMismatchError,
    check_mpi_size,
    detect,
    launcher_comm,
    rank_from_env,
    torch_launch,
)
from feedline.errors import ConfigError
from feedline.pipeline import world as pworld
from feedline.progress import process_rank

LAUNCH_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "MPI_LOCAL", "SLURM_", "TORCHELASTIC_")
TORCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")

SLURM_JOB = {  # what every process of a 4-task, 2-node allocation sees
    "SLURM_JOB_ID": "123",
    "SLURM_JOBID": "123",
    "SLURM_NTASKS": "4",
    "SLURM_NPROCS": "4",
    "SLURM_NNODES": "2",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_JOB_NODELIST": "n[1-2]",
}
SRUN_TASK2 = {  # task 2 of `srun -n 4` in it: first task of the second node
    **SLURM_JOB,
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_PROCID": "2",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1",
    "SLURM_SRUN_COMM_HOST": "10.0.0.1",
}

# name -> (environment, expected (kind, rank, size, local_rank, local_size))
CASES = {
    "hydra": (
        {
            "PMI_RANK": "2",
            "PMI_SIZE": "4",
            "PMI_FD": "9",
            "MPI_LOCALRANKID": "0",
            "MPI_LOCALNRANKS": "2",
        },
        ("hydra", 2, 4, 0, 2),
    ),
    "openmpi": (
        {
            "OMPI_COMM_WORLD_RANK": "2",
            "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_LOCAL_RANK": "0",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            "PMIX_RANK": "2",  # Open MPI's mpirun sets both
            "PMIX_NAMESPACE": "prterun-n1-1@1",
        },
        ("openmpi", 2, 4, 0, 2),
    ),
    "pmix": (
        {"PMIX_RANK": "2", "PMIX_SIZE": "4", "PMIX_NAMESPACE": "job.1"},
        ("pmix", 2, 4, None, None),
    ),
    "pmix+slurm": (  # srun --mpi=pmix: PMIX_RANK only, the size comes from the step
        {**SRUN_TASK2, "PMIX_RANK": "2", "PMIX_NAMESPACE": "slurm.pmix.123.0"},
        ("pmix", 2, 4, 0, 2),
    ),
    "pmi2+slurm": (  # srun --mpi=pmi2
        {**SRUN_TASK2, "PMI_RANK": "2", "PMI_SIZE": "4", "PMI_FD": "7"},
        ("hydra", 2, 4, 0, 2),
    ),
    "srun": (SRUN_TASK2, ("slurm", 2, 4, 0, 2)),
    "srun, audit's minimal": (
        {"SLURM_NTASKS": "4", "SLURM_PROCID": "2"},
        ("slurm", 2, 4, None, None),
    ),
    "srun, uneven nodes": (
        {
            **SRUN_TASK2,
            "SLURM_STEP_TASKS_PER_NODE": "3,1",
            "SLURM_PROCID": "3",
            "SLURM_NODEID": "1",
        },
        ("slurm", 3, 4, 0, 1),
    ),
    "sbatch script": (  # the batch step: task 0, no step id, SLURM_NTASKS of the job
        {
            **SLURM_JOB,
            "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "0",
            "SLURM_GTIDS": "0",
        },
        ("none", 0, 1, 0, 1),
    ),
    "salloc shell": (SLURM_JOB, ("none", 0, 1, 0, 1)),
    "batch step id": (  # a tool that exported the batch step's id (0xfffffffe)
        {**SLURM_JOB, "SLURM_PROCID": "0", "SLURM_STEP_ID": "4294967294"},
        ("none", 0, 1, 0, 1),
    ),
    "srun -n 1": (
        {
            **SLURM_JOB,
            "SLURM_STEP_ID": "1",
            "SLURM_STEP_NUM_TASKS": "1",
            "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "0",
        },
        ("slurm", 0, 1, 0, None),
    ),
    "torchrun": (
        {
            "RANK": "2",
            "WORLD_SIZE": "4",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "1",
            "TORCHELASTIC_RUN_ID": "none",
        },
        ("torchrun", 2, 4, 0, 2),
    ),
    "torchrun under srun": (  # srun -N 2 --ntasks-per-node 1 torchrun --nproc-per-node 2
        {
            **SLURM_JOB,
            "SLURM_STEP_ID": "0",
            "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_PROCID": "1",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "1",
            "RANK": "2",
            "WORLD_SIZE": "4",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "1",
            "TORCHELASTIC_RUN_ID": "123",
        },
        ("torchrun", 2, 4, 0, 2),
    ),
    "torch variables without torchrun": (
        {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"},
        ("torchrun", 2, 4, None, 4),
    ),
    "torch variables under mpiexec": (  # a script exported them for torch.distributed
        {"PMI_RANK": "1", "PMI_SIZE": "2", "RANK": "1", "WORLD_SIZE": "2"},
        ("hydra", 1, 2, None, None),
    ),
    "mpiexec -n 1": ({"PMI_RANK": "0", "PMI_SIZE": "1"}, ("hydra", 0, 1, None, None)),
    "none": ({}, ("none", 0, 1, 0, 1)),
}


def _fields(launch: Launch) -> tuple:
    return (launch.kind, launch.rank, launch.size, launch.local_rank, launch.local_size)


def _set_env(monkeypatch, env: dict[str, str]) -> None:
    for var in list(os.environ):
        if var.startswith(LAUNCH_PREFIXES) or var in TORCH_VARS:
            monkeypatch.delenv(var)
    for k, v in env.items():
        monkeypatch.setenv(k, v)


class _FakeComm:
    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.size


def _fake_mpi(monkeypatch, rank: int, size: int) -> list[int]:
    """A stand-in ``mpi4py`` whose COMM_WORLD has *size* ranks (never initialised, so
    progress bars read the environment). Returns a list that counts imports of it."""
    imported: list[int] = []
    mpi = types.ModuleType("mpi4py.MPI")
    mpi.COMM_WORLD = _FakeComm(rank, size)
    mpi.Is_initialized = lambda: False
    mpi.Is_finalized = lambda: False
    pkg = types.ModuleType("mpi4py")

    def getattr_(name):
        if name == "MPI":
            imported.append(1)
            return mpi
        raise AttributeError(name)

    pkg.__getattr__ = getattr_
    monkeypatch.setitem(sys.modules, "mpi4py", pkg)
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", mpi)
    # the pipeline's node discovery would call MPI: not what these tests are about
    monkeypatch.setattr(pworld, "_dist", lambda comm, nodes: types.SimpleNamespace(nodes=1))
    return imported


def _no_mpi(monkeypatch) -> None:
    """Any import of mpi4py fails (proves the code path never imports it)."""
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", None)


@pytest.mark.parametrize("name", list(CASES))
def test_detect_reads_each_launcher(name):
    env, expected = CASES[name]
    launch = detect(env)
    assert _fields(launch) == expected, launch
    assert launch.kind in KINDS
    assert launch.by_mpi == (launch.kind in ("hydra", "openmpi", "pmix"))
    assert launch.mpi_world == (
        launch.kind in ("hydra", "openmpi", "pmix", "slurm") and expected[2] > 1
    )
    assert rank_from_env(env) == expected[1]
    for pair in launch.source.split():  # the message names only variables that are set
        key, _, value = pair.partition("=")
        assert env.get(key) == value


@pytest.mark.parametrize("name", list(CASES))
def test_every_consumer_agrees_with_detect(name, monkeypatch):
    """The Loader's world, dist.World, dist's and pipeline's launched_by_mpi and the
    progress bars' rank: one answer per environment."""
    env, (kind, rank, size, _, _) = CASES[name]
    _set_env(monkeypatch, env)
    launch = detect()
    assert _fields(launch) == CASES[name][1]
    assert dist_launched_by_mpi() is launch.mpi_world
    assert pworld.launched_by_mpi() == (size if launch.by_mpi else 0)
    if launch.mpi_world:
        imported = _fake_mpi(monkeypatch, rank, size)  # MPI agrees with the launcher
        assert process_rank() == rank
        w = pworld.resolve_world(None)
        assert imported and (w.rank, w.size, w.launcher) == (rank, size, "mpi")
        _fake_mpi(monkeypatch, 0, 1)  # MPI sees one process: refused, on both paths
        with pytest.raises(LaunchMismatchError, match=f"started {size} processes but MPI sees 1"):
            pworld.resolve_world(None)
        with pytest.raises(LaunchMismatchError):
            World.from_comm()
    elif kind == "torchrun" and size > 1:
        _no_mpi(monkeypatch)
        assert process_rank() == rank
        with pytest.raises(ConfigError, match="torchrun"):
            pworld.resolve_world(None)
        with pytest.raises(ConfigError, match="torchrun"):
            World.from_comm()
    else:  # one process: a 1-rank world and mpi4py never imported
        _no_mpi(monkeypatch)
        assert process_rank() == rank == 0
        w = pworld.resolve_world(None)
        assert (w.rank, w.size, w.launcher, w.comm) == (0, 1, "single", None)
        d = World.from_comm()
        assert (d.rank, d.size, d.comm) == (0, 1, None)


def test_torch_adapter_keeps_its_torch_variables_under_srun(monkeypatch):
    """feedline.torch builds its world from RANK/WORLD_SIZE even inside an srun step
    (a DDP script that exported them): torch_env_world reads them whatever detect()
    chose, and launched_by_mpi() (PMI only) does not claim the job."""
    _set_env(monkeypatch, {**SRUN_TASK2, "RANK": "2", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"})
    assert detect().kind == "slurm"
    assert pworld.launched_by_mpi() == 0
    assert pworld.torch_env_world() == (2, 4, 2)
    assert _fields(torch_launch()) == ("torchrun", 2, 4, None, 2)
    _set_env(monkeypatch, {"WORLD_SIZE": "4"})  # no RANK: no torch world, still refused
    assert pworld.torch_env_world() is None
    assert detect().multi_process and detect().kind == "torchrun"


def test_slurm_tasks_per_node_formats():
    base = {"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "11", "SLURM_LOCALID": "0"}
    per_node = "4(x2),3"
    for node, first, local in ((0, 0, 4), (1, 4, 4), (2, 8, 3)):
        env = {
            **base,
            "SLURM_STEP_TASKS_PER_NODE": per_node,
            "SLURM_NODEID": str(node),
            "SLURM_PROCID": str(first),
        }
        assert detect(env).local_size == local
    # job-level variable when the step's is missing; SLURM_NTASKS_PER_NODE last
    env = {**base, "SLURM_TASKS_PER_NODE": "2(x3)", "SLURM_NODEID": "2", "SLURM_PROCID": "4"}
    assert detect(env).local_size == 2
    env = {**base, "SLURM_NTASKS_PER_NODE": "5", "SLURM_PROCID": "4"}
    assert detect(env).local_size == 5
    env = {**base, "SLURM_TASKS_PER_NODE": "garbage", "SLURM_NODEID": "0", "SLURM_PROCID": "0"}
    assert detect(env).local_size is None


def test_half_set_environments_ask_mpi_instead_of_guessing():
    only_rank = detect({"PMIX_RANK": "3"})  # PMIx without a size, outside srun
    assert (only_rank.kind, only_rank.rank, only_rank.size) == ("pmix", 3, None)
    assert only_rank.mpi_world and only_rank.multi_process
    check_mpi_size(only_rank, 1)  # nothing to compare with: MPI decides
    bad = detect({"PMI_RANK": "5", "PMI_SIZE": "4"})
    assert bad.size is None and bad.mpi_world
    assert detect({"WORLD_SIZE": "x", "RANK": "1"}).kind == "none"
    assert detect({"PMI_SIZE": "garbage"}).mpi_world  # an MPI launcher, size unknown


def test_mismatch_messages_say_how_to_fix():
    srun = detect(CASES["srun"][0])
    with pytest.raises(LaunchMismatchError) as e:
        check_mpi_size(srun, 1)
    msg = str(e.value)
    assert "srun" in msg and "started 4 processes but MPI sees 1" in msg
    assert "--mpi=pmi2" in msg and "--mpi=pmix" in msg and "mpiexec -n 4" in msg
    assert isinstance(e.value, ConfigError)
    hydra = detect(CASES["hydra"][0])
    with pytest.raises(LaunchMismatchError, match=r"PMI_SIZE=4.*mpiexec of the MPI mpi4py"):
        check_mpi_size(hydra, 1)
    check_mpi_size(hydra, 4)
    check_mpi_size(detect(CASES["mpiexec -n 1"][0]), 1)


def test_missing_mpi4py_under_a_launcher(monkeypatch):
    _set_env(monkeypatch, CASES["srun"][0])
    _no_mpi(monkeypatch)
    with pytest.raises(ConfigError, match="mpi4py is missing"):
        launcher_comm()
    with pytest.raises(ConfigError, match="mpi4py is missing"):
        pworld.resolve_world(None)


# ------------------------------------------------------------------- real processes

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from dataclasses import asdict
    from feedline.dist.launch import detect
    from feedline.pipeline.world import resolve_world
    from feedline.progress import process_rank

    launch = detect()
    before = "mpi4py" in sys.modules
    env_rank = process_rank()
    try:
        w = resolve_world(None)
        world = {"rank": w.rank, "size": w.size, "launcher": w.launcher}
        w.close()
    except Exception as e:
        world = {"error": type(e).__name__, "text": str(e)}
    row = {"launch": asdict(launch), "mpi_world": launch.mpi_world,
           "mpi4py_before": before, "env_rank": env_rank, "world": world,
           "mpi_rank": process_rank()}
    with open(f"{sys.argv[1]}/rank-{launch.rank}.json", "w") as f:
        json.dump(row, f)
    """
)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(LAUNCH_PREFIXES) and k not in TORCH_VARS
    }
    env.pop("FEEDLINE_NODES", None)
    env.update(FEEDLINE_POLL_SLEEP_US="500", OMP_NUM_THREADS="1", **extra)
    return env


@pytest.mark.mpi
def test_real_mpiexec_two_ranks_agree(tmp_path):
    from feedline_tools.bench.harness import mpiexec_command

    script = tmp_path / "who.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [mpiexec_command(), "-n", "2", sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_clean_env(),
    )
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    rows = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    assert [r["launch"]["rank"] for r in rows] == [0, 1]
    for r in rows:
        launch = r["launch"]
        assert launch["size"] == 2 and launch["kind"] in ("hydra", "openmpi", "pmix")
        assert launch["local_size"] in (2, None) and r["mpi_world"]
        assert not r["mpi4py_before"]  # detect() and the progress rank never import MPI
        assert r["world"] == {"rank": launch["rank"], "size": 2, "launcher": "mpi"}
        assert r["env_rank"] == r["mpi_rank"] == launch["rank"]


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="mpi4py not installed")
def test_real_srun_without_pmi_is_refused(tmp_path):
    """An srun step whose MPI gets no PMI: emulated by one process with srun's variables
    (the real MPI initialises as a singleton, as under `srun --mpi=none`)."""
    script = tmp_path / "who.py"
    script.write_text(SCRIPT)
    step = dict(SRUN_TASK2, SLURM_PROCID="0", SLURM_NODEID="0")
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_clean_env(**step),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    row = json.loads((tmp_path / "rank-0.json").read_text())
    assert row["launch"]["kind"] == "slurm" and row["launch"]["size"] == 4
    assert row["world"]["error"] == "LaunchMismatchError"
    assert "started 4 processes but MPI sees 1" in row["world"]["text"]
    assert "srun --mpi=pmi2" in row["world"]["text"]
