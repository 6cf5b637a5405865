# SPDX-License-Identifier: Apache-2.0
"""One peer on one rank: ``python -m feedline_tools.bench.peer_run CONFIG.json``.

Started by ``feedline bench peers`` in a fresh process per loader and rank count (under
``mpiexec -n N`` for N > 1: rank and size come from the launcher's environment), so
peak RSS and ``/proc/self/io`` belong to that loader alone. ``mode = "prepare"`` makes
the peer's cached copy of the dataset (before the caches are dropped); ``mode = "run"``
imports the peer's package (untimed), then times one epoch: time to the first batch,
the wait in every ``next()``, the wall time. A sampler thread reads
``/proc/PID/io`` and ``VmHWM`` of the process and of every descendant (DataLoader
workers) every 100 ms, so bytes and read calls to storage include the workers'. The
delivered ids are written to ``ids-RANK.npz`` for the parent's exactly-once and shuffle
checks, the figures to ``rank-RANK.json``.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import time
import traceback
from typing import Any

import numpy as np

from feedline.dist.launch import detect
from feedline_tools.bench import peer_loaders as pl

_FIELDS = ("read_bytes", "syscr")


def _proc_io(pid: int | str) -> dict[str, int]:
    out = dict.fromkeys(_FIELDS, 0)
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in out:
                    out[k] = int(v)
    except (OSError, ValueError):
        pass
    return out


def _hwm(pid: int | str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _children(pid: int) -> list[int]:
    """Descendants of *pid* (walks /proc/*/stat)."""
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
            parent[int(d)] = int(s[s.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError):
            continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


class Sampler(threading.Thread):
    """Polls the descendants' I/O counters and peak RSS while the epoch runs."""

    def __init__(self, period: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.period = period
        self.seen: dict[int, dict[str, int]] = {}
        self._stop_evt = threading.Event()

    def poll(self) -> None:
        for c in _children(os.getpid()):
            io = _proc_io(c)
            prev = self.seen.get(c, {})
            self.seen[c] = {
                "read_bytes": max(io["read_bytes"], prev.get("read_bytes", 0)),
                "syscr": max(io["syscr"], prev.get("syscr", 0)),
                "hwm": max(_hwm(c), prev.get("hwm", 0)),
            }

    def run(self) -> None:
        while not self._stop_evt.wait(self.period):
            self.poll()

    def stop(self) -> dict[str, int]:
        self._stop_evt.set()
        self.join()
        return {
            "read_bytes": sum(d["read_bytes"] for d in self.seen.values()),
            "syscr": sum(d["syscr"] for d in self.seen.values()),
            "hwm": sum(d["hwm"] for d in self.seen.values()),
            "processes": len(self.seen),
        }


def _rank_size() -> tuple[int, int]:
    launch = detect()
    return launch.rank or 0, launch.size or 1


def run_epoch(name: str, ctx: pl.PeerContext, out_dir: str, port: int = 0) -> dict[str, Any]:
    pkg = pl.LOADERS[name][0]
    if pkg == "streaming":
        pl.import_streaming(ctx.notes)  # import time is not the loader's
    elif pkg:
        importlib.import_module(pkg)  # import time is not the loader's
    if pkg in ("streaming", "litdata"):  # launched as torchrun would
        pl._env_dist(ctx, port)
    if pkg is None and ctx.size > 1:
        from mpi4py import MPI  # noqa: F401 - feedline ranks talk over MPI

    io0 = _proc_io("self")
    sampler = Sampler()
    sampler.start()
    waits: list[float] = []
    steps: list[np.ndarray] = []
    t0 = time.perf_counter()
    it = pl.LOADERS[name][2](ctx)
    ttfb = None
    while True:
        a = time.perf_counter()
        try:
            ids = next(it)
        except StopIteration:
            break
        b = time.perf_counter()
        if ttfb is None:
            ttfb = b - t0
        else:
            waits.append(b - a)
        steps.append(np.asarray(ids, dtype=np.int64).reshape(-1))
    wall = time.perf_counter() - t0
    sampler.poll()
    kids = sampler.stop()
    io1 = _proc_io("self")
    offs = np.cumsum([0] + [len(s) for s in steps])
    np.savez(
        os.path.join(out_dir, f"ids-{ctx.rank}.npz"),
        ids=np.concatenate(steps) if steps else np.zeros(0, np.int64),
        offs=offs,
    )
    return {
        "rank": ctx.rank,
        "steps": len(steps),
        "samples": int(offs[-1]),
        "wall_s": wall,
        "ttfb_s": ttfb,
        "wait_mean_s": float(np.mean(waits)) if waits else 0.0,
        "wait_total_s": float(np.sum(waits)),
        "peak_rss_bytes": _hwm("self") + kids["hwm"],
        "read_bytes": io1["read_bytes"] - io0["read_bytes"] + kids["read_bytes"],
        "syscr": io1["syscr"] - io0["syscr"] + kids["syscr"],
        "worker_processes": kids["processes"],
        "notes": ctx.notes,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        cfg = json.load(f)
    rank, size = _rank_size()
    ctx = pl.PeerContext(
        lmdb=cfg["lmdb"],
        cache=cfg["cache"],
        n=int(cfg["n"]),
        classes=int(cfg["classes"]),
        batch=int(cfg["batch"]) // size,
        rank=rank,
        size=size,
        seed=int(cfg.get("seed", 0)),
        workers=int(cfg.get("workers", 2)),
    )
    out = cfg["out"]
    try:
        if cfg["mode"] == "prepare":
            doc: dict[str, Any] = {"path": pl.prepare(cfg["name"], ctx)}
        else:
            doc = run_epoch(cfg["name"], ctx, out, int(cfg.get("port", 0)))
    except BaseException as e:  # the row says why, the bench goes on
        last = [ln for ln in str(e).splitlines() if ln.strip()][-1:] or [""]
        doc = {
            "rank": rank,
            "error": f"{type(e).__name__}: {last[0].strip()}"[:300],
            "traceback": traceback.format_exc()[-2000:],
        }
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(doc, f)
    sys.stdout.flush()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.COMM_WORLD.Barrier()
        mpi.Finalize()
    # peers leave threads (tf.data, Mosaic) that can hold up interpreter exit
    os._exit(0)


if __name__ == "__main__":
    main()
