# SPDX-License-Identifier: Apache-2.0
"""Never hang (docs/reliability.md), under real ``mpiexec`` with 4 ranks on 2 emulated
nodes: a persistent I/O error on one rank raises a typed error on every rank (error
agreement) for every non-store preset, whether the error escapes or is caught; a
failure on one rank while the others block in a training-loop collective ends the job
(exit guard: ``MPI_Abort`` with a message); the rank-kill matrix (SIGKILL of one rank
in a collective, holding a token, in the node hand-off, between steps; with and without
the launcher's auto-cleanup): every rank ends within 60 s, nothing is left in
``/dev/shm`` or the dataset directory, and the last checkpoint resumes exactly.

Default tier: a quick selection; ``--full``: every preset x victim x kill point x
cleanup setting.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from feedline_tools.bench.harness import mpiexec_command
from feedline_tools.make import generate

pytestmark = pytest.mark.mpi
HERE = os.path.dirname(__file__)
RUN = os.path.join(HERE, "mpi", "reliability_run.py")
P = 4
# DatasetNotFoundError: the file was removed before a reader opened it (names the path)
TYPED = {
    "StorageError",
    "CorruptDataError",
    "DatasetNotFoundError",
    "PeerFailedError",
    "PeerTimeoutError",
}
#: non-store presets (the DeepIO store's rank death is tested with the store)
PRESETS = {
    "feedline": [],
    "feedline-node": ["--source", "node"],
    "tf": [],
    "tf-pre": [],
    "async": [],
    "async-db": [],
    "lmdb": [],
    "lmm": [],
    "lmm-dm": [],
    "lmm-dio": [],
    "lmm-dio-prov": [],
    "lmm-dio-prov-coal": [],
    "lmm-dio-prov-coal-stag": [],
}


def preset_args(name: str) -> list[str]:
    return [name.replace("-node", "")] + PRESETS[name]


@pytest.fixture(scope="module")
def lmdb_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("rel-mpi")
    path = str(root / "c10")
    generate("cifar10-large", path, progress=False, samples=1200)
    return path


def launch(args: list[str], tmp, tag: str, cleanup: bool = True, timeout: float = 150):
    """Run the driver; return (outcomes by rank, wall seconds, rc, log)."""
    env = dict(os.environ, FEEDLINE_POLL_SLEEP_US="500", OMP_NUM_THREADS="1", FEEDLINE_NODES="2")
    rep = os.path.join(str(tmp), f"rep-{tag}")
    cmd = [mpiexec_command()]
    if not cleanup:
        cmd.append("-disable-auto-cleanup")
    cmd += ["-n", str(P), sys.executable, RUN, *args, "--report", rep]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    wall = time.monotonic() - t0
    outcomes = {}
    for r in range(P):
        f = f"{rep}.{r}.txt"
        if os.path.exists(f):
            with open(f) as fh:
                m = re.match(
                    r"OUTCOME rank=(\d+) kind=(\w+) type=(\S+) s=([\d.]+) msg=(.*)", fh.read()
                )
            assert m, f
            outcomes[r] = (m.group(2), m.group(3), float(m.group(4)), m.group(5))
    return outcomes, wall, p.returncode, p.stdout + p.stderr[-4000:]


def fresh_copy(src: str, tmp, tag: str) -> str:
    import shutil

    dst = os.path.join(str(tmp), f"data-{tag}")
    shutil.copytree(src, dst)
    return dst


# ------------------------------------------------------------ error agreement
QUICK_AGREE = ["lmm-dio-prov-coal-stag", "feedline-node", "tf", "lmm"]


def check_agreement(lmdb_data, tmp, name: str, catch: bool) -> None:
    data = fresh_copy(lmdb_data, tmp, f"{name}-{catch}")
    args = [data, *preset_args(name), "--fault", "unlink", "--batch", "8"]
    if catch:
        args.append("--catch")
    out, wall, _, log = launch(args, tmp, f"agree-{name}-{catch}")
    assert wall < 60, f"{name}: {wall:.0f} s\n{log}"
    assert len(out) == P, f"{name}: not every rank raised\n{log}"
    for r, (kind, typ, secs, msg) in out.items():
        assert kind == "error" and typ in TYPED, (name, r, typ, msg)
        assert secs < 60
        if typ == "PeerFailedError":
            assert re.search(
                r"rank \d+ failed: (StorageError|DatasetNotFoundError): .*data.mdb", msg
            ), msg
    # the failing rank(s) name the file (the others name them)
    assert any(o[1] in ("StorageError", "DatasetNotFoundError") for o in out.values())


@pytest.mark.parametrize("name", QUICK_AGREE)
def test_persistent_error_every_rank_raises_typed(lmdb_data, tmp_path, name):
    check_agreement(lmdb_data, tmp_path, name, catch=False)


def test_caught_error_then_normal_exit_does_not_hang(lmdb_data, tmp_path):
    """Every rank catches the error and returns normally: the exit guard ends the job
    (a clean finalize when every rank is in, else MPI_Abort) instead of a hang."""
    check_agreement(lmdb_data, tmp_path, "lmm-dio-prov-coal-stag", catch=True)


@pytest.mark.full
@pytest.mark.parametrize("catch", [False, True])
@pytest.mark.parametrize("name", list(PRESETS))
def test_persistent_error_every_rank_raises_typed_full(lmdb_data, tmp_path, name, catch):
    check_agreement(lmdb_data, tmp_path, name, catch)


@pytest.mark.parametrize("name", ["tf", "feedline"])
def test_one_rank_fails_while_the_others_block_in_a_training_collective(lmdb_data, tmp_path, name):
    """rank 1 fails at step 3; the others block in a blocking allreduce (a gradient
    step): the exit guard waits 10 s for them, then MPI_Abort with a message."""
    out, wall, rc, log = launch(
        [lmdb_data, *preset_args(name), "--fail", "1:3", "--user-allreduce", "--batch", "8"],
        tmp_path,
        f"blocked-{name}",
    )
    assert wall < 60, log
    assert rc != 0
    assert out[1][1] == "StorageError"
    assert "calling MPI_Abort so that the job does not hang" in log, log


# ------------------------------------------------------------- the kill matrix
#: (preset, victim, point): the points a victim reaches with this data (2 nodes of 2
#: ranks: readers 0 and 2 for the node/aggregated presets)
QUICK_KILLS = [
    ("lmm-dio-prov-coal-stag", 2, "token:1", True),
    ("lmm-dio-prov-coal-stag", 2, "token:1", False),
    ("feedline-node", 1, "handoff:1", False),
    ("feedline-node", 0, "handoff:2", True),
    # the report file of this case was missing once in 3 runs (2026-11-25, 06:55, older
    # code); since then 26 of 26 runs passed and reports are written atomically
    # (docs/reliability.md, "Limits")
    ("lmm", 3, "collective:3", False),
    ("tf", 1, "step:5", True),
]
POINTS = {
    "feedline": ["step:5"],
    "feedline-node": ["handoff:1", "handoff:2", "step:5"],
    "tf": ["step:5"],
    "tf-pre": ["step:5"],
    "async": ["step:5"],
    "async-db": ["step:5"],
    "lmdb": ["step:5"],
    "lmm": ["collective:1", "collective:3", "step:5"],
    "lmm-dm": ["step:5"],
    "lmm-dio": ["collective:1", "collective:2", "step:5"],
    "lmm-dio-prov": ["step:5"],
    "lmm-dio-prov-coal": ["step:5"],
    "lmm-dio-prov-coal-stag": ["token:1", "token:2", "step:5"],
}


def check_kill(lmdb_data, tmp, name: str, victim: int, point: str, cleanup: bool) -> None:
    tag = f"{name}-{victim}-{point.replace(':', '')}-{int(cleanup)}"
    data = fresh_copy(lmdb_data, tmp, tag)
    base_args = [data, *preset_args(name), "--batch", "8", "--epochs", "2"]
    base_h = os.path.join(str(tmp), f"base-{tag}")
    out, _, rc, log = launch([*base_args, "--hashes", base_h], tmp, f"base-{tag}")
    assert rc == 0 and len(out) == P, log
    files_before = sorted(os.listdir(data))
    ckpt = os.path.join(str(tmp), f"ckpt-{tag}.json")
    out, wall, rc, log = launch(
        [*base_args, "--kill", f"{victim}:{point}", "--checkpoint", ckpt],
        tmp,
        f"kill-{tag}",
        cleanup,
    )
    assert wall < 60, f"{tag}: the job ran {wall:.0f} s\n{log}"
    assert rc != 0, f"{tag}: the kill point was never reached\n{log}"
    for r, (kind, typ, secs, msg) in out.items():  # survivors that got to report
        assert r != victim
        assert secs < 60 and (kind == "ok" or typ in TYPED), (r, kind, typ, msg)
    time.sleep(0.5)
    with open(os.path.join(str(tmp), f"rep-kill-{tag}.shm")) as f:
        mapped = json.load(f)  # what the victim mapped when it was killed
    assert mapped, "the victim mapped no shared memory?"
    left = [p for p in mapped if os.path.exists(p)]
    assert not left, f"{tag}: shared memory left: {left}"
    assert sorted(os.listdir(data)) == files_before, "files left in the dataset directory"
    # the last checkpoint resumes exactly: the rest of both epochs, the same bytes
    res_h = os.path.join(str(tmp), f"res-{tag}")
    extra = ["--resume", ckpt] if os.path.exists(ckpt) else []
    out, _, rc, log = launch([*base_args, "--hashes", res_h, *extra], tmp, f"res-{tag}")
    assert rc == 0, log
    pos = (0, 0)
    if extra:
        with open(ckpt) as f:
            st = json.load(f)
        pos = (int(st["epoch"]), int(st["step"]))
    for r in range(P):
        with open(f"{base_h}.{r}.json") as f:
            base = {(e, s): h for e, s, _, h in json.load(f)}
        with open(f"{res_h}.{r}.json") as f:
            # the driver runs --epochs from the resumed epoch: compare the two of the base
            got = {(e, s): h for e, s, _, h in json.load(f) if e < 2}
        want = {k: h for k, h in base.items() if k >= pos}
        assert got == want, f"{tag}: rank {r} resumed with other batches than the fault-free run"


@pytest.mark.parametrize(("name", "victim", "point", "cleanup"), QUICK_KILLS)
def test_kill_matrix_quick(lmdb_data, tmp_path, name, victim, point, cleanup):
    check_kill(lmdb_data, tmp_path, name, victim, point, cleanup)


@pytest.mark.full
@pytest.mark.parametrize("cleanup", [True, False])
@pytest.mark.parametrize("victim", [0, 1, 2, 3])
@pytest.mark.parametrize(("name", "point"), [(n, p) for n, pts in POINTS.items() for p in pts])
def test_kill_matrix_full(lmdb_data, tmp_path, name, point, victim, cleanup):
    if (
        point.startswith(("token", "handoff", "collective"))
        and victim in (1, 3)
        and not (name == "feedline-node" or name == "lmm")
    ):
        pytest.skip("this rank never reaches that point (not a reader)")
    check_kill(lmdb_data, tmp_path, name, victim, point, cleanup)


# ---------------------------------------------------------- the torch example
def test_train_torch_example_ends_after_an_error(tmp_path):
    """examples/train_torch.py: rank 1's data fails at step 2 while rank 0 waits in
    DDP's gradient allreduce (gloo): the job ends within 60 s with feedline's message
    instead of hanging in MPI_Finalize."""
    pytest.importorskip("torch")
    env = dict(os.environ, OMP_NUM_THREADS="1", FEEDLINE_POLL_SLEEP_US="500")
    env.pop("FEEDLINE_NODES", None)
    example = os.path.join(HERE, "..", "examples", "train_torch.py")
    cmd = [
        mpiexec_command(),
        "-n",
        "2",
        sys.executable,
        example,
        "--data",
        str(tmp_path / "cifar"),
        "--samples",
        "96",
        "--batch",
        "16",
        "--epochs",
        "1",
        "--fail-rank",
        "1",
        "--fail-after",
        "2",
    ]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    wall = time.monotonic() - t0
    log = p.stdout + p.stderr
    assert wall < 60, log
    assert p.returncode != 0, log
    assert "rank 1: data error" in log, log
    assert "calling MPI_Abort so that the job does not hang" in log, log
