# SPDX-License-Identifier: Apache-2.0
"""What every MPI rank of a benchmark job runs: ``python -m feedline_tools.bench.worker CONFIG``.

Every run first does one untimed warm-up step. Then, for each repeat, the job measures
the physical limit, then every run: caches dropped by
one rank per node, a barrier, the runner timed on each rank, a barrier, then — outside
the timed region — the digest streamed to rank 0 and the per-rank figures gathered.
Rank 0 turns them into the result document (:func:`feedline_tools.bench.report.build_document`)
and writes it to the path the config names. Waits use ``Ibarrier`` polled with short
sleeps, because MPICH busy-polls blocking calls and would steal the CPU of ranks still
reading when ranks outnumber cores.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import resource
import sys
import time
import traceback
from typing import Any

from feedline import defaults
from feedline.dist.launch import MPI_KINDS, detect, launcher_comm
from feedline.errors import ConfigError
from feedline.plan.world import WorldSpec
from feedline_tools.bench import limit as _limit
from feedline_tools.bench.digest import DeliveryRecorder, gather_digest
from feedline_tools.bench.runners import DatasetSpec, RunContext, Source, make_runner


def under_mpiexec() -> bool:
    """True when this process was started by an MPI launcher or an srun step (any size;
    feedline.dist.launch decides)."""
    return detect().kind in (*MPI_KINDS, "slurm")


def world_comm() -> Any:
    """COMM_WORLD when started by an MPI launcher with more than one rank, else None."""
    comm = launcher_comm()
    return comm if comm is not None and comm.Get_size() > 1 else None


def wait_all(comm: Any) -> None:
    """A barrier that sleeps while it waits instead of spinning."""
    if comm is None:
        return
    req = comm.Ibarrier()
    pause = defaults.get("poll_sleep_us") / 1e6
    while not req.Test():
        time.sleep(pause)


def _reset_peak_rss() -> bool:
    """Reset the kernel's resident-set high-water mark (Linux >= 4.0), so the peak is
    per run rather than per process."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _usage() -> dict[str, int]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    u = {
        "ctx_voluntary": ru.ru_nvcsw,
        "ctx_involuntary": ru.ru_nivcsw,
        "major_faults": ru.ru_majflt,
        "peak_rss_bytes": _peak_rss(),
        "proc_read_bytes": 0,
    }
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    u["proc_read_bytes"] = int(line.split()[1])
    except OSError:
        pass
    return u


def _emulator_stats(source: Source) -> dict[str, float]:
    """Request counters of the emulated node whose view this rank reads (if any)."""
    emu = _limit.emulator_for(source.path)
    if emu is None:
        return {}
    node = _limit.emulator_node(source.path)
    try:
        stats = dict(emu.stats())
    except Exception:
        return {}
    per_node = stats.get("per_node")
    if isinstance(per_node, list):
        mine = [d for d in per_node if isinstance(d, dict) and d.get("node") == node]
        stats = mine[0] if mine else {}
    return {k: v for k, v in stats.items() if isinstance(v, int | float) and k != "node"}


class _Job:
    def __init__(self, config: dict[str, Any], comm: Any) -> None:
        self.cfg = config
        self.comm = comm
        self.rank = comm.Get_rank() if comm is not None else 0
        self.size = comm.Get_size() if comm is not None else 1
        nodes = int(config.get("nodes") or defaults.get("nodes") or 1)
        self.world = WorldSpec(self.size, nodes)
        self.node = self.world.node_of(self.rank)
        self.leader = self.world.ranks_of(self.node)[0] == self.rank
        self.source = Source(DatasetSpec.from_json(config["dataset"]), self.node)

    # -------------------------------------------------------------- collectives
    def gather(self, obj: Any) -> list[Any] | None:
        if self.comm is None:
            return [obj]
        return self.comm.gather(obj, root=0)

    def allgather(self, obj: Any) -> list[Any]:
        if self.comm is None:
            return [obj]
        return self.comm.allgather(obj)

    def cold(self) -> None:
        """Drop the caches of this node's view of the data (one rank per node)."""
        wait_all(self.comm)
        if self.leader:
            _limit.drop_caches(self.source.files)
        wait_all(self.comm)

    # ---------------------------------------------------------------- measure
    def measure_limit(self) -> list[dict[str, Any]] | None:
        opt = self.cfg.get("limit") or {}
        self.cold()
        wait_all(self.comm)
        err = None
        try:
            r = _limit.read_share(
                self.source.files,
                self.rank,
                self.size,
                block=int(opt.get("block", _limit.DEFAULT_BLOCK)),
                direct=bool(opt.get("direct", True)),
            )
            mine = {"bytes": r.bytes, "seconds": r.seconds, "ops": r.ops, "method": r.method}
        except OSError as e:
            err = f"{type(e).__name__}: {e}"
            mine = {"bytes": 0, "seconds": 0.0, "ops": 0, "method": "failed", "error": err}
        wait_all(self.comm)
        return self.gather(mine)

    def _context(self, run: dict[str, Any], steps: int | None) -> RunContext:
        cfg = self.cfg
        return RunContext(
            rank=self.rank,
            size=self.size,
            nodes=self.world.nodes,
            node=self.node,
            comm=self.comm,
            source=self.source,
            batch_size=int(cfg["batch_size"]),
            steps=steps,
            compute_s=float(cfg.get("compute_ms") or 0) / 1e3,
            seed=int(cfg.get("seed") or 0),
            assignment=run.get("assignment") or cfg.get("assignment") or "contiguous",
        )

    def warm_up(self, run: dict[str, Any]) -> None:
        """One untimed step of *run*, so that the first measured run does not pay for
        lazy imports and first-touch allocations the others get for free. Errors are
        left for the measured run to report."""
        ctx = self._context(run, 1)
        runner = None
        try:
            runner = make_runner(run["runner"], run.get("options"))
            runner.prepare(ctx)
            runner.run(ctx, DeliveryRecorder(self.rank, enabled=False))
        except Exception:
            pass
        finally:
            if runner is not None:
                with contextlib.suppress(Exception):
                    runner.close()
        wait_all(self.comm)

    def measure_run(self, run: dict[str, Any]) -> dict[str, Any] | None:
        cfg = self.cfg
        ctx = self._context(run, cfg.get("steps"))
        rec = DeliveryRecorder(self.rank, enabled=bool(cfg.get("digest", True)))
        runner = None
        mine: dict[str, Any] = {"rank": self.rank, "node": self.node, "error": None}
        try:
            runner = make_runner(run["runner"], run.get("options"))
            runner.prepare(ctx)
        except Exception as e:
            mine["error"] = _describe(e)
        self.cold()
        emu0 = _emulator_stats(self.source) if self.leader else {}
        _reset_peak_rss()
        u0 = _usage()
        wait_all(self.comm)
        t0 = time.perf_counter()
        outcome = None
        if mine["error"] is None and runner is not None:
            try:
                outcome = runner.run(ctx, rec)
            except Exception as e:
                mine["error"] = _describe(e)
        elapsed = time.perf_counter() - t0 - rec.seconds
        u1 = _usage()
        wait_all(self.comm)
        if runner is not None:
            try:
                runner.close()
            except Exception as e:
                mine["error"] = mine["error"] or _describe(e)
        emu1 = _emulator_stats(self.source) if self.leader else {}
        mine.update(
            time_s=elapsed,
            steps=rec.steps,
            samples=rec.samples,
            payload_bytes=rec.payload_bytes,
            ctx_switches=(u1["ctx_voluntary"] - u0["ctx_voluntary"])
            + (u1["ctx_involuntary"] - u0["ctx_involuntary"]),
            ctx_voluntary=u1["ctx_voluntary"] - u0["ctx_voluntary"],
            ctx_involuntary=u1["ctx_involuntary"] - u0["ctx_involuntary"],
            major_faults=u1["major_faults"] - u0["major_faults"],
            proc_read_bytes=u1["proc_read_bytes"] - u0["proc_read_bytes"],
            peak_rss_bytes=u1["peak_rss_bytes"],
        )
        if outcome is not None:
            mine.update(
                io_s=outcome.io_s,
                seek_s=outcome.seek_s,
                exposed_io_s=outcome.exposed_io_s,
                storage_bytes=int(outcome.storage_bytes),
                storage_ops=int(outcome.storage_ops),
                rl=outcome.rl,
                extra=outcome.extra,
            )
        if emu1:
            mine["emulator"] = {k: emu1[k] - emu0.get(k, 0) for k in emu1}
        failed = any(self.allgather(mine["error"] is not None))
        digest = None
        if not failed and rec.enabled:
            digest = gather_digest(rec, self.comm)
        rec.close()
        ranks = self.gather(mine)
        if ranks is None:
            return None
        return {"ranks": ranks, "digest": digest}

    def execute(self) -> dict[str, Any] | None:
        cfg = self.cfg
        repeats = max(1, int(cfg.get("repeats") or 1))
        want_limit = (cfg.get("limit") or {}).get("enabled", True)
        limits: list[Any] = []
        samples: dict[str, list[Any]] = {r["name"]: [] for r in cfg["runs"]}
        if cfg.get("warmup", True):
            for run in cfg["runs"]:
                self.warm_up(run)
        for _ in range(repeats):
            if want_limit:
                limits.append(self.measure_limit())
            for run in cfg["runs"]:
                samples[run["name"]].append(self.measure_run(run))
        if self.rank != 0:
            self.source.close()
            return None
        for run in cfg["runs"]:
            rl = self.order_rl(run)
            for rep in samples[run["name"]]:
                for r in rep["ranks"]:
                    if r.get("rl") is None and r.get("error") is None:
                        r["rl"] = rl
        self.source.close()
        from feedline_tools.bench.report import build_document

        return build_document(cfg, self.world, limits, samples)

    def order_rl(self, run: dict[str, Any]) -> float | None:
        """DeepIO's RL of the order a run delivers: its Loader preset, or the peers'
        assignment (None when the planner's RL is not available)."""
        name, _, arg = run["runner"].partition(":")
        order = (
            (arg or "feedline")
            if name == "loader"
            else (run.get("assignment") or self.cfg.get("assignment") or "contiguous")
        )
        try:
            from feedline.plan.rl import randomization_level

            return float(randomization_level(order, n=len(self.source.index)))
        except Exception:
            return None


def _describe(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    where = f" ({tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno})" if tb else ""
    return f"{type(e).__name__}: {e}{where}"


def execute(config: dict[str, Any], comm: Any = None) -> dict[str, Any] | None:
    """Run the benchmark described by *config* on this rank; rank 0 returns the document.

    Parameters
    ----------
    config : dict
        ``scenario``, ``dataset`` (:class:`DatasetSpec` as JSON), ``runs`` (list of
        ``{"name", "runner", "options", "params"}``), ``batch_size``, ``steps``,
        ``compute_ms``, ``repeats``, ``seed``, ``assignment``, ``baseline``, ``nodes``,
        ``limit`` (``{"enabled", "block", "direct"}``), ``digest`` (bool), ``warmup``
        (bool, default True), ``runner_modules`` (modules to import first).
    comm : mpi4py communicator, optional
        None for a single process.
    """
    for mod in config.get("runner_modules") or ():
        importlib.import_module(mod)  # scenario-defined runners register themselves
    names = [r["name"] for r in config["runs"]]
    if len(set(names)) != len(names):
        raise ConfigError(f"run names must be unique: {names}")
    return _Job(config, comm).execute()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m feedline_tools.bench.worker CONFIG.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        config = json.load(f)
    comm = world_comm()
    doc = execute(config, comm)
    if doc is not None and config.get("result"):
        tmp = config["result"] + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, config["result"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
