# SPDX-License-Identifier: Apache-2.0
"""``feedline demo``: the quick demo end to end under real mpiexec (and the storage
emulator when FUSE is usable), its table and JSON, and cleanup on exit, Ctrl-C and
SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from feedline import ConfigError
from feedline.plan.strategy import PRESETS
from feedline_tools.bench import report
from feedline_tools.demo import BASELINE, CURSOR, FEEDLINE, LADDER, demo_presets, ensure_dataset
from feedline_tools.emulate import EmulatorUnavailable, check_available


def _emulator_usable() -> bool:
    try:
        check_available()
    except EmulatorUnavailable:
        return False
    return os.geteuid() == 0


def _mounted(path: str) -> bool:
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f if len(line.split()) > 1)


def _env(tmp_path) -> dict[str, str]:
    """Index sidecars of the read-only emulated views go to the test's own directory."""
    return dict(os.environ, FEEDLINE_CACHE_DIR=str(tmp_path / "sidecars"))


def _demo(tmp_path, *argv: str, timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "feedline",
        "demo",
        "--cache",
        str(tmp_path / "cache"),
        "--out",
        str(tmp_path / "out"),
        *argv,
    ]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, check=False, env=_env(tmp_path)
    )


def _rows(stdout: str) -> dict[str, list[str]]:
    """The demo's table: run name -> its cells (split on runs of 2+ spaces)."""
    lines = stdout.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("run "))
    rows = {}
    for ln in lines[head + 2 :]:
        if not ln.strip():
            break
        cells = re.split(r"\s{2,}", ln.strip())
        rows[cells[0]] = cells
    return rows


# ------------------------------------------------------------------ pure parts


def test_presets_baseline_first_then_ladder_then_feedline():
    names = demo_presets()
    assert names[0] == BASELINE and names[-1] == FEEDLINE
    ladder = [p for p in names if p in LADDER]
    assert ladder == [p for p in LADDER if p in PRESETS]  # the paper's order
    assert len(set(names)) == len(names)
    assert demo_presets(["feedline", "lmdb"]) == ["lmdb", "feedline"]
    with pytest.raises(ConfigError, match="unknown preset"):
        demo_presets(["no-such-preset"])


def test_dataset_generated_once_and_reused(tmp_path):
    said: list[str] = []
    p1 = ensure_dataset(str(tmp_path), 300, seed=3, echo=said.append)
    mtime = os.stat(os.path.join(p1, "data.mdb")).st_mtime_ns
    p2 = ensure_dataset(str(tmp_path), 300, seed=3, echo=said.append)
    assert p1 == p2 and os.stat(os.path.join(p2, "data.mdb")).st_mtime_ns == mtime
    assert "written" in said[0] and "cached" in said[1]
    # no leftovers of the private generation directory
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(p1)]
    import lmdb

    with lmdb.open(p1, readonly=True, lock=False) as env:
        assert env.stat()["entries"] == 300
    p3 = ensure_dataset(str(tmp_path), 300, seed=3, fresh=True, echo=said.append)
    assert p3 == p1 and os.stat(os.path.join(p3, "data.mdb")).st_mtime_ns != mtime


def test_unusable_out_dir_is_refused_before_any_work(tmp_path, capsys):
    from feedline.cli import main

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    rc = main(
        ["demo", "--quick", "--cache", str(tmp_path / "cache"), "--out", str(blocker / "out")]
    )
    assert rc == 1 and "cannot write results to --out" in capsys.readouterr().err
    assert not (tmp_path / "cache").exists()


# ------------------------------------------------------------- end to end


@pytest.mark.mpi
def test_quick_demo_table_and_json(tmp_path):
    out = tmp_path / "demo.json"
    p = _demo(tmp_path, "--quick", "--no-plots", "--json", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    if _emulator_usable():
        assert "storage: storage emulator, 2 nodes" in p.stdout
        mnt = re.search(r"storage emulator mounted at (\S+)", p.stdout).group(1)
        assert f"storage emulator unmounted from {mnt}" in p.stdout
        assert not _mounted(mnt) and not os.path.exists(mnt)
    else:
        assert "storage: local disk" in p.stdout, p.stdout
    rows = _rows(p.stdout)
    assert BASELINE in rows and FEEDLINE in rows and CURSOR in rows, p.stdout
    assert rows[BASELINE][-3:] == ["1.00x", "no", "reference"]
    # only the shuffling presets say yes, with their randomization level
    assert rows[FEEDLINE][-2].startswith("yes, RL "), rows[FEEDLINE]
    assert rows[CURSOR][-2] == "no"
    assert re.search(r"physical limit: \d+ MB/s", p.stdout)

    doc = json.loads(out.read_text())
    report.validate(doc)
    assert doc["scenario"] == "demo" and doc["baseline"] == BASELINE
    assert doc["limit_MBps"] > 0
    runs = {r["name"]: r for r in doc["runs"]}
    assert list(runs) == [*demo_presets(), CURSOR]
    for r in runs.values():
        assert r["error"] is None, r["error"]
        assert (r["ranks"], r["nodes"]) == (4, 2)
        assert r["payload_bytes"] == runs[BASELINE]["payload_bytes"] > 0
        assert r["MBps"] == pytest.approx(r["payload_bytes"] / r["time_s"] / 1e6)
        assert r["ratio_to_baseline"] == pytest.approx(r["MBps"] / runs[BASELINE]["MBps"])
        assert r["fraction_of_limit"] <= 1 + 1e-9  # never above the same run's limit
        if _emulator_usable():
            # every run started cold and read its data from the emulated servers
            assert sum(e["bytes"] for e in r["stats"]["emulator"] if e) > 0
    # liblmdb's own cursor walk delivers exactly the baseline's stream
    assert runs[CURSOR]["digest"] == runs[BASELINE]["digest"]
    # the presets that keep Caffe's order deliver the same bytes as the baseline
    for name in ("lmm", "lmm-dm", "lmm-dio", "lmm-dio-prov"):
        if name in runs:
            assert runs[name]["digest"] == runs[BASELINE]["digest"], name
    assert runs[FEEDLINE]["rl"] > runs[BASELINE]["rl"]  # feedline shuffles; Caffe does not
    # the sidecar was written beside the data before mounting: no rank wrote its own
    sidecars = tmp_path / "sidecars"
    assert not sidecars.exists() or not os.listdir(sidecars)


@pytest.mark.mpi
def test_local_disk_is_said_plainly(tmp_path):
    p = _demo(
        tmp_path,
        "--quick",
        "--no-emulator",
        "--no-plots",
        "--no-cursor",
        "--presets",
        "feedline",
        "--ranks",
        "2",
        "--nodes",
        "1",
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "storage: local disk" in p.stdout and "emulator mounted" not in p.stdout
    assert "note: read from local disk" in p.stdout
    assert list(_rows(p.stdout)) == [BASELINE, FEEDLINE]
    doc = json.loads((tmp_path / "out" / "demo.json").read_text())
    report.validate(doc)
    assert {(r["ranks"], r["nodes"]) for r in doc["runs"]} == {(2, 1)}
    assert (tmp_path / "out" / "demo.md").exists()


@pytest.mark.mpi
def test_under_mpiexec_needs_a_path_then_runs_in_the_job(tmp_path):
    from feedline_tools.bench.harness import mpiexec_command
    from feedline_tools.make import generate

    demo = [sys.executable, "-m", "feedline", "demo", "--quick", "--no-plots"]
    p = subprocess.run(
        [mpiexec_command(), "-n", "2", *demo, "--cache", str(tmp_path / "c")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=_env(tmp_path),
    )
    assert p.returncode == 1 and "without mpiexec" in p.stderr, p.stderr
    assert not (tmp_path / "c").exists()  # refused before generating anything

    # on cluster storage: every rank of the job reads --path; rank 0 alone reports
    data = generate("cifar10-large", tmp_path / "db", samples=600, seed=1, progress=False)
    p = subprocess.run(
        [
            mpiexec_command(),
            "-n",
            "2",
            *demo,
            "--path",
            data,
            "--nodes",
            "2",
            "--presets",
            "feedline",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env=_env(tmp_path),
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("physical limit:") == 1 and "2 ranks / 2 nodes" in p.stdout
    assert list(_rows(p.stdout)) == [BASELINE, FEEDLINE, CURSOR]
    doc = json.loads((tmp_path / "out" / "demo.json").read_text())
    assert {(r["ranks"], r["nodes"]) for r in doc["runs"]} == {(2, 2)}
    runs = {r["name"]: r for r in doc["runs"]}
    assert runs[CURSOR]["digest"] == runs[BASELINE]["digest"]
    # every record delivered once per run: the payload is the whole dataset
    from feedline import open_dataset

    with open_dataset(data) as ds:
        total = int(ds.index.lengths.sum())
    assert runs[FEEDLINE]["payload_bytes"] == runs[BASELINE]["payload_bytes"] == total


def _group_gone(pgid: int, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.mpi
@pytest.mark.fuse
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_interrupted_demo_unmounts(tmp_path, how):
    if not _emulator_usable():
        pytest.skip("needs /dev/fuse, the feedline-fuse binary and root")
    cmd = [
        sys.executable,
        "-m",
        "feedline",
        "demo",
        "--cache",
        str(tmp_path / "cache"),
        "--out",
        str(tmp_path / "out"),
        "--samples",
        "4000",
        "--repeats",
        "3",
        "--no-plots",
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=_env(tmp_path),
    )
    try:
        mnt = None
        for line in proc.stdout:
            m = re.search(r"storage emulator mounted at (\S+)", line)
            if m:
                mnt = m.group(1)
            if line.startswith("running "):
                break
        assert mnt is not None and _mounted(mnt)
        time.sleep(2.0)  # inside the MPI job
        if how == "ctrl-c":  # a terminal sends SIGINT to the whole foreground group
            os.killpg(proc.pid, signal.SIGINT)
        else:  # a job manager signals the demo alone
            os.kill(proc.pid, signal.SIGTERM)
        _rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert not _mounted(mnt) and not os.path.exists(mnt)
    # no MPI rank or emulator daemon of the demo is left behind
    assert _group_gone(proc.pid, 30)
