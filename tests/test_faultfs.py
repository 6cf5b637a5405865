# SPDX-License-Identifier: Apache-2.0
"""The FUSE fault file system family (docs/reliability.md): the storage emulator injects
EIO (transient and persistent), ESTALE and ENOENT after a good open, EINTR, short reads
and stalls (20 s; 45 s in the full tier) into the reads of a real mount; the Loader runs under real ``mpiexec``
with 1, 2 and 4 ranks and every batch's bytes are hashed against a fault-free run.

Outcomes: a transient fault (EIO, EINTR, retried by the engine) gives the same bytes
as the fault-free run; a persistent one gives a typed error on every rank (the rank
that met it: ``StorageError``; the others ``PeerFailedError`` naming it, or their own
``StorageError``); a short read is taken by the kernel as the end of the file
(``CorruptDataError`` naming file and offset); a stall past ``timeout_s`` gives
``StorageTimeoutError`` well before the stall ends. Never wrong bytes, never a hang.

The default tier runs one preset per world size; ``--full`` runs every non-store
preset at every world size.
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
from feedline_tools.emulate import Emulator, EmulatorParams, EmulatorUnavailable, check_available
from feedline_tools.make import generate

HERE = os.path.dirname(__file__)
RUN = os.path.join(HERE, "mpi", "reliability_run.py")


def _fuse_ok() -> str | None:
    try:
        check_available()
    except EmulatorUnavailable as e:
        return str(e)
    return None


_why_not = _fuse_ok()
pytestmark = [
    pytest.mark.mpi,
    pytest.mark.fuse,
    pytest.mark.skipif(_why_not is not None, reason=f"emulator unavailable: {_why_not}"),
]

FAST = EmulatorParams(
    latency_us=100, node_mbps=4000, aggregate_mbps=8000, server_mbps=4000, seek_us=100
)
TYPED = {
    "StorageError",
    "CorruptDataError",
    "PeerFailedError",
    "PeerTimeoutError",
    "StorageTimeoutError",
}
#: (fault, count, expected): "same" bytes, or a typed "error" on every rank
KINDS = {
    "eio-transient": ("eio", 2, "same"),
    "eintr": ("eintr", 3, "same"),
    "eio-persistent": ("eio", 0, "error"),
    "estale": ("estale", 0, "error"),
    "enoent": ("enoent", 0, "error"),
    "short": ("short", 0, "error"),
    "stall": ("stall", 0, "timeout"),
}
NON_STORE = (
    "feedline",
    "tf",
    "tf-pre",
    "async",
    "async-db",
    "lmm-dio-prov",
    "lmm-dio-prov-coal",
    "lmm-dio-prov-coal-stag",
)
#: seconds a "stall" fault holds its read: the ranks must raise at the 3 s timeout, long
#: before it ends. A job's processes still end only when it does (a thread stuck in a
#: FUSE read keeps its process a zombie until the daemon answers), so the default tier
#: stalls for less than the full tier.
STALL_S = {False: 20, True: 45}
QUICK = {
    1: ("tf", list(KINDS)),
    2: ("feedline", ["eio-transient", "eio-persistent", "stall"]),
    4: ("lmm-dio-prov-coal-stag", ["eintr", "estale", "stall"]),
}


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    root = tmp_path_factory.mktemp("faultfs")
    generate("cifar10-bin", str(root / "src"), progress=False, samples=600)
    with Emulator(str(root / "src"), str(root / "mnt"), params=FAST) as e:
        yield e


def run(
    emu, P: int, preset: str, tmp, tag: str, timeout: float = 0.0, inject: str | None = None
) -> tuple[dict, float, str]:
    env = dict(os.environ, FEEDLINE_POLL_SLEEP_US="500", OMP_NUM_THREADS="1")
    env["FEEDLINE_NODES"] = "2" if P >= 4 else "0"
    out = os.path.join(str(tmp), f"{tag}-{P}-{preset}")
    cmd = [
        mpiexec_command(),
        "-n",
        str(P),
        sys.executable,
        RUN,
        str(emu.node_path(0)),
        preset,
        "--hashes",
        out,
        "--report",
        out,
        "--batch",
        "16",
    ]
    if timeout:
        cmd += ["--timeout", str(timeout)]
    if inject:
        cmd += ["--inject", inject]
    emu.drop_caches()
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    wall = time.monotonic() - t0
    outcomes = {}  # from the report files: the ranks' stdout lines may interleave
    for r in range(P):
        f = f"{out}.{r}.txt"
        if os.path.exists(f):
            with open(f) as fh:
                text = fh.read()
            m = re.match(r"OUTCOME rank=(\d+) kind=(\w+) type=(\S+) s=([\d.]+) msg=(.*)", text)
            assert m, text
            outcomes[r] = (m.group(2), m.group(3), float(m.group(4)), m.group(5))
    hashes = {}
    for r in range(P):
        p = f"{out}.{r}.json"
        if os.path.exists(p):
            with open(p) as f:
                hashes[r] = {tuple(x[:2]): x[3] for x in json.load(f)}
    return (
        {"outcomes": outcomes, "hashes": hashes, "rc": proc.returncode},
        wall,
        proc.stdout + proc.stderr[-3000:],
    )


def check_case(emu, P, preset, case, tmp, baselines, full: bool = False) -> str:
    key = (P, preset)
    if key not in baselines:
        base, _, log = run(emu, P, preset, tmp, "base")
        assert base["rc"] == 0 and len(base["outcomes"]) == P, log
        baselines[key] = base["hashes"]
    kind, count, expect = KINDS[case]
    stall = STALL_S[full]
    inject = f"{kind}:{count}" + (f":{stall}" if kind == "stall" else "")
    try:
        res, wall, log = run(
            emu, P, preset, tmp, case, timeout=3.0 if kind == "stall" else 0.0, inject=inject
        )
    finally:
        emu.clear_faults()
    assert wall < 90, f"{case}: the job took {wall:.0f} s\n{log}"
    assert len(res["outcomes"]) == P, f"{case}: not every rank reported\n{log}"
    for r, (k, typ, secs, msg) in res["outcomes"].items():
        # a stalled read gives up at the timeout (3 s), not when the stall ends
        assert secs < (stall - 3 if kind == "stall" else 60), (r, secs, stall)
        for step, h in res["hashes"].get(r, {}).items():  # never wrong bytes
            assert baselines[key][r][step] == h, f"{case}: rank {r} step {step}: other bytes"
        if expect == "same":
            assert k == "ok", f"{case}: rank {r}: {typ} {msg}\n{log}"
        else:
            assert k == "error" and typ in TYPED, f"{case}: rank {r}: {k} {typ} {msg}\n{log}"
    if expect == "same":
        assert res["rc"] == 0 and res["hashes"] == baselines[key], log
    if expect == "timeout":
        types = {o[1] for o in res["outcomes"].values()}
        assert "StorageTimeoutError" in types, types
    return expect


@pytest.mark.parametrize("P", [1, 2, 4])
def test_fault_family_quick(emu, tmp_path, P):
    preset, cases = QUICK[P]
    baselines: dict = {}
    for case in cases:
        check_case(emu, P, preset, case, tmp_path, baselines)


@pytest.mark.full
@pytest.mark.parametrize("P", [1, 2, 4])
@pytest.mark.parametrize("preset", NON_STORE)
def test_fault_family_full(emu, tmp_path, P, preset):
    baselines: dict = {}
    for case in KINDS:
        check_case(emu, P, preset, case, tmp_path, baselines, full=True)


@pytest.mark.parametrize("preset", ["tf", "feedline", "async-db", "lmm-dio-prov-coal"])
def test_stall_is_bounded_by_timeout_and_close_does_not_wait(emu, preset):
    """A 45 s stall with timeout_s=2, one process: StorageTimeoutError in about 2 s,
    close() at once, the Loader refuses to iterate again, a new one works after."""
    import json as _json

    from feedline import ConfigError, Loader, StorageTimeoutError, open_dataset

    root = str(emu.node_path(0))
    with open(os.path.join(root, ".feedline-make.json")) as f:
        m = _json.load(f)
    ds = open_dataset(root, format=m["format"], **m.get("open_options", {}))
    _ = ds.index
    ld = Loader(ds, 16, preset=preset, timeout_s=2, decode=False)
    emu.drop_caches()
    emu.fault("stall", "data_batch", seconds=45)
    try:
        t0 = time.monotonic()
        with pytest.raises(StorageTimeoutError, match="within 2 s"):
            for _ in ld:
                pass
        took = time.monotonic() - t0
        t1 = time.monotonic()
        ld.close()
        closed = time.monotonic() - t1
        assert 1.5 < took < 8, took
        assert closed < 1.0, closed
        with pytest.raises(ConfigError, match="closed"):
            iter(ld)
    finally:
        emu.clear_faults()
    with Loader(ds, 16, preset=preset, timeout_s=2, decode=False) as fresh:
        assert sum(len(b.ids) for b in fresh) == 600
