# SPDX-License-Identifier: Apache-2.0
"""One measurement of ``feedline bench deepio``, run on every rank (under mpiexec).

    python -m feedline_tools.bench.deepio_worker CONFIG.json OUT.json

CONFIG: ``task`` (``bw`` or ``pipe``), ``path`` (``{node}`` = node view), ``record_bytes``,
``batch`` (global), ``modes`` (bw: ``seq``, ``ordered``, ``opportunistic``), ``R``,
``iter_ms`` and ``epochs`` (pipe), ``emulator`` (the mount to drop caches on, or None: fadvise).
Rank 0 writes OUT (sums over ranks; times from barrier to barrier).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import numpy as np

_BLOCK = 8 << 20


def _comm():
    from feedline_tools.bench.worker import world_comm

    return world_comm()


def _cold(cfg: dict[str, Any], ds, comm) -> None:
    """Make the next reads cold: the emulator's node views, or the page cache."""
    rank = comm.Get_rank() if comm is not None else 0
    if rank == 0:
        if cfg.get("emulator"):
            from feedline_tools.emulate import Emulator

            Emulator.attach(cfg["emulator"]).drop_caches()
        else:
            from feedline.io import evict

            evict(list(ds.files))
    _barrier(comm)


def _barrier(comm) -> None:
    if comm is not None:
        from feedline_tools.bench.worker import wait_all

        wait_all(comm)


def _sum(comm, x: float) -> float:
    return float(comm.allreduce(x)) if comm is not None else float(x)


def _max(comm, x: float) -> float:
    from mpi4py import MPI

    return float(comm.allreduce(x, op=MPI.MAX)) if comm is not None else float(x)


def _seq(ds, comm) -> dict[str, Any]:
    """N-to-N sequential reads: each rank reads its contiguous share in 8 MiB preads."""
    from feedline.plan.layout import even_split

    P = comm.Get_size() if comm is not None else 1
    me = comm.Get_rank() if comm is not None else 0
    idx = ds.index
    lo, hi = even_split(len(idx), P, me)
    buf = np.empty(_BLOCK, dtype=np.uint8)
    got = 0
    t0 = time.perf_counter()
    if hi > lo:
        fids = np.asarray(idx.file_ids[lo:hi])
        for f in np.unique(fids).tolist():
            sel = np.flatnonzero(fids == f) + lo
            a = int(idx.offsets[sel[0]])
            b = int(idx.offsets[sel[-1]] + idx.lengths[sel[-1]])
            fd = os.open(ds.files[f], os.O_RDONLY)
            try:
                pos = a
                while pos < b:
                    n = os.preadv(fd, [buf.data[: min(_BLOCK, b - pos)]], pos)
                    if n <= 0:
                        break
                    pos += n
                    got += n
            finally:
                os.close(fd)
    _barrier(comm)
    return {"s": time.perf_counter() - t0, "bytes": _sum(comm, got)}


def _store(cfg, ds, comm, preset: str) -> dict[str, Any]:
    from feedline.loader import Loader

    kw: dict[str, Any] = {"memory_fraction": 1.0, "seed": 1, "decode": False}
    out: dict[str, Any] = {}
    with Loader(ds, int(cfg["batch"]), preset=preset, comm=comm, **kw) as ld:
        for epoch, key in ((0, "cold_s"), (1, "s")):
            ld.set_epoch(epoch)
            if epoch == 0:
                _cold(cfg, ds, comm)
            else:
                _barrier(comm)
            t0 = time.perf_counter()
            n = 0
            for b in ld:
                n += int(b.lengths.sum()) if b.lengths is not None else b.data.nbytes
            _barrier(comm)
            out[key] = time.perf_counter() - t0
            st = ld.stats()
            p = st.get("store_pass", {})
            out[f"e{epoch}"] = {
                "bytes": _sum(comm, n),
                "rma_gets": _sum(comm, p.get("rma_gets", 0)),
                "rma_bytes": _sum(comm, p.get("rma_bytes", 0)),
                "rma_wait_s": _max(comm, p.get("rma_wait_s", 0.0)),
                "node_bytes": _sum(comm, p.get("node_bytes", 0)),
                "local_bytes": _sum(comm, p.get("local_bytes", 0)),
            }
        out["bytes"] = out["e1"]["bytes"]
    return out


def _pipe(cfg, ds, comm) -> dict[str, Any]:
    from feedline.loader import Loader

    R = float(cfg["R"])
    kw: dict[str, Any] = {"seed": 1, "decode": False}
    if R == 0:  # every element read from storage when its batch is asked for
        kw.update(store="off", prefetch_depth=0)
    else:
        kw["memory_fraction"] = R
    pause = float(cfg["iter_ms"]) / 1e3
    epochs = int(cfg.get("epochs", 1))
    times = []
    with Loader(ds, int(cfg["batch"]), preset="deepio-ordered", comm=comm, **kw) as ld:
        _cold(cfg, ds, comm)  # cold once: an R = 1 store keeps what it loaded
        steps = 0
        for epoch in range(epochs):
            ld.set_epoch(epoch)
            t0 = time.perf_counter()
            for _b in ld:
                time.sleep(pause)
                steps += 1
            _barrier(comm)
            times.append(time.perf_counter() - t0)
        st = ld.stats()
    return {
        "s": sum(times),
        "epochs_s": times,
        "steps": steps,
        "storage_bytes": _sum(comm, st.get("storage_bytes", 0)),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        cfg = json.load(f)
    comm = _comm()
    from feedline.dataset import open_dataset

    ds = open_dataset(
        cfg["path"], format="records", record_bytes=int(cfg["record_bytes"]), comm=comm
    )
    res: dict[str, Any] = {}
    if cfg["task"] == "bw":
        for mode in cfg["modes"]:
            if mode == "seq":
                _cold(cfg, ds, comm)
                res[mode] = _seq(ds, comm)
            else:
                res[mode] = _store(cfg, ds, comm, f"deepio-{mode}")
    else:
        res = _pipe(cfg, ds, comm)
    if comm is None or comm.Get_rank() == 0:
        with open(argv[1], "w") as f:
            json.dump(res, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
