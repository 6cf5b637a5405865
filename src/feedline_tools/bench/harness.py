# SPDX-License-Identifier: Apache-2.0
"""The side-by-side benchmark harness every ``feedline bench`` scenario runs on.

A scenario describes *what* to compare — a list of :class:`RunSpec` (a named runner
configuration), a dataset, a batch size — and calls :func:`run_scenario`. The harness
decides *how* to run it: in this process for ``--ranks 1``; on every rank when the
command was itself started by ``mpiexec``; otherwise it launches ``mpiexec -n N`` with
``FEEDLINE_NODES=M`` re-invoking ``python -m feedline_tools.bench.worker``. Every run starts
from cold caches, is repeated ``--repeats`` times (medians are reported) and is set
against the physical limit measured in the same job. The trade-off of launching a fresh
job rather than reusing the caller's process: a second of start-up per scenario, in
exchange for a clean MPI world whose size the user chose on the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from feedline import defaults
from feedline.errors import ConfigError, FeedlineError
from feedline.plan.world import WorldSpec
from feedline.units import count_at_least as at_least
from feedline_tools.bench import report
from feedline_tools.bench.runners import DatasetSpec
from feedline_tools.bench.worker import execute, under_mpiexec, world_comm


@dataclass(frozen=True)
class RunSpec:
    """One configuration of a comparison.

    Parameters
    ----------
    name : str
        Row label (unique within a scenario), e.g. ``"pread-64K"``.
    runner : str
        Registered runner, e.g. ``"seq"``, ``"mmap"``, ``"loader:lmm"``.
    options : dict
        Keyword options of the runner (JSON-serialisable), e.g. ``{"block": 65536}``.
    params : dict
        Facts for the report and plots, e.g. ``{"method": "pread", "block_bytes": 65536}``.
    assignment : str, optional
        Peers' sample assignment for this run (``contiguous``/``strided``); default: the
        scenario's.
    """

    name: str
    runner: str
    options: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    assignment: str | None = None


def _size(text: str) -> int:
    """'4K', '8M', '1G' or a plain number of bytes."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        return int(float(t[:-1] if mult > 1 else t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from None


def size_label(n: int) -> str:
    """4096 -> '4K', 8388608 -> '8M'."""
    return report._size_label(n)


def add_common_arguments(parser: argparse.ArgumentParser, *, steps: int | None = None) -> None:
    """The options every scenario takes (docs/benchmarks.md, "Running a scenario": --json, --ranks, --nodes, --path,
    --quick), plus repeats, artefacts, baseline, emulated compute and step count."""
    g = parser.add_argument_group("harness")
    g.add_argument("--json", metavar="PATH", help="write the result document here")
    g.add_argument(
        "--ranks",
        type=at_least(1),
        default=None,
        metavar="N",
        help="MPI ranks (launches mpiexec -n N; default 1, or the size of the "
        "job when started under mpiexec)",
    )
    g.add_argument(
        "--nodes",
        type=at_least(1),
        default=None,
        metavar="M",
        help="emulated nodes (FEEDLINE_NODES; node = rank*M//N)",
    )
    g.add_argument("--path", metavar="P", help="dataset path ({node} = node index)")
    g.add_argument("--quick", action="store_true", help="tiny sizes, one repeat (smoke test)")
    g.add_argument(
        "--repeats",
        type=at_least(1),
        default=None,
        metavar="R",
        help="repeat every run R times from cold cache; medians reported (default 3, "
        "1 with --quick)",
    )
    g.add_argument(
        "--out",
        metavar="DIR",
        default="bench-out",
        help="directory for the table, JSON and plots (default: bench-out)",
    )
    g.add_argument("--baseline", metavar="RUN", help="run the ratios refer to (default: first)")
    g.add_argument(
        "--compute-ms",
        type=float,
        default=0.0,
        metavar="MS",
        help="emulated compute per step, milliseconds (sleep)",
    )
    g.add_argument(
        "--steps",
        type=at_least(1),
        default=steps,
        metavar="S",
        help="steps per run (default: one epoch)",
    )
    g.add_argument(
        "--limit-block",
        type=_size,
        default=8 << 20,
        metavar="BYTES",
        help="block size of the physical-limit reads (default 8M)",
    )
    g.add_argument("--no-limit", action="store_true", help="do not measure the physical limit")
    g.add_argument("--no-digest", action="store_true", help="do not keep and hash deliveries")
    report.add_plot_arguments(g)
    g.add_argument(
        "--no-warmup", action="store_true", help="no untimed warm-up step before the runs"
    )


def mpiexec_command() -> str:
    """The ``mpiexec`` to launch with: ``FEEDLINE_MPIEXEC``, the one beside this Python
    (the mpich wheel installs it there), or the first on PATH."""
    env = defaults.get("mpiexec")
    if env:
        return env
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("mpiexec")
    if not found:
        raise ConfigError("--ranks > 1 needs mpiexec (pip install mpi4py mpich)")
    return found


def is_root() -> bool:
    """True on the process that prints and writes artefacts (rank 0, or a lone process)."""
    comm = world_comm()
    return comm is None or comm.Get_rank() == 0


def _launch(config: dict[str, Any], ranks: int, nodes: int, workdir: str) -> dict[str, Any]:
    cfg_path = os.path.join(workdir, "config.json")
    config = dict(config, result=os.path.join(workdir, "result.json"))
    with open(cfg_path, "w") as f:
        json.dump(config, f)
    env = dict(os.environ, FEEDLINE_NODES=str(nodes))
    cmd = [
        mpiexec_command(),
        "-n",
        str(ranks),
        sys.executable,
        "-m",
        "feedline_tools.bench.worker",
        cfg_path,
    ]
    proc = subprocess.run(cmd, env=env, check=False)
    if proc.returncode != 0 or not os.path.exists(config["result"]):
        raise FeedlineError(f"benchmark job failed (exit {proc.returncode}): {' '.join(cmd)}")
    with open(config["result"]) as f:
        return json.load(f)


def run_scenario(
    name: str,
    runs: Sequence[RunSpec],
    dataset: DatasetSpec | Callable[[], DatasetSpec],
    args: argparse.Namespace,
    *,
    batch_size: int,
    assignment: str = "contiguous",
    seed: int = 0,
    runner_modules: Sequence[str] = (),
) -> dict[str, Any] | None:
    """Run *runs* side by side on *dataset* and report them.

    Parameters
    ----------
    name : str
        Scenario name (``doc["scenario"]``, artefact file names).
    runs : sequence of RunSpec
    dataset : DatasetSpec or callable returning one
        A callable is called once, on the root process only (generate data there).
    args : argparse.Namespace
        Parsed options of :func:`add_common_arguments`.
    batch_size : int
        Global batch size B.
    assignment : {"contiguous", "strided"}
        Peers' sample assignment (runs may override it).
    seed : int
        Passed to loaders.
    runner_modules : sequence of str
        Modules every rank imports before building runners (scenarios that register
        their own runners with ``register_runner``).

    Returns
    -------
    dict or None
        The result document on the root process, None on other ranks.
    """
    if not runs:
        raise ConfigError("a scenario needs at least one run")
    comm = world_comm()
    in_job = under_mpiexec()
    size = comm.Get_size() if comm is not None else 1
    ranks = args.ranks if args.ranks is not None else size
    if in_job and ranks != size:
        raise ConfigError(
            f"--ranks {ranks} but this job has {size} ranks; drop --ranks "
            "when starting under mpiexec"
        )
    nodes = args.nodes or int(defaults.get("nodes") or 1)
    world = WorldSpec(ranks, nodes)  # validates nodes <= ranks
    root = comm is None or comm.Get_rank() == 0
    spec = None
    if root:
        spec = dataset() if callable(dataset) else dataset
    if comm is not None:
        spec = comm.bcast(spec, root=0)
    assert spec is not None
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    config: dict[str, Any] = {
        "scenario": name,
        "dataset": spec.to_json(),
        "runs": [asdict(r) for r in runs],
        "batch_size": int(batch_size),
        "steps": args.steps,
        "compute_ms": float(args.compute_ms or 0.0),
        "repeats": int(repeats),
        "seed": int(seed),
        "assignment": assignment,
        "baseline": args.baseline,
        "nodes": world.nodes,
        "limit": {"enabled": not args.no_limit, "block": int(args.limit_block), "direct": True},
        "digest": not args.no_digest,
        "warmup": not args.no_warmup,
        "runner_modules": list(runner_modules),
    }
    if args.baseline and args.baseline not in {r.name for r in runs}:
        raise ConfigError(f"--baseline {args.baseline!r} is not a run: {[r.name for r in runs]}")
    if in_job or ranks == 1:
        doc = execute(config, comm)
    else:
        with tempfile.TemporaryDirectory(prefix="feedline-bench-") as tmp:
            doc = _launch(config, ranks, world.nodes, tmp)
    if doc is None:
        return None
    report.emit(doc, out_dir=args.out, json_path=args.json, plots=not args.no_plots)
    return doc


def exit_code(doc: dict[str, Any] | None) -> int:
    """0 when every run succeeded (or on non-root ranks), 1 otherwise."""
    if doc is None:
        return 0
    return 1 if any(r.get("error") for r in doc["runs"]) else 0
