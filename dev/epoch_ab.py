# SPDX-License-Identifier: Apache-2.0
"""Two Loader presets in one job, their epochs interleaved, so that both see the same
machine (load, page cache, memory placement): seconds per epoch, page cache emptied
before every epoch (docs/deepio.md, "The issue's bars").

    mpiexec -n 4 python dev/epoch_ab.py DATASET PRESET_A PRESET_B [EPOCHS]

The Loaders are created A then B; swap the arguments to swap that too. Epoch e runs A
then B when e is even, B then A when odd.
"""

from __future__ import annotations

import statistics
import sys
import time

from mpi4py import MPI

from feedline import Loader, open_dataset
from feedline.io import evict as drop_cached

comm = MPI.COMM_WORLD
path, names = sys.argv[1], sys.argv[2:4]
epochs = int(sys.argv[4]) if len(sys.argv) > 4 else 10
ds = open_dataset(path, comm=comm)


def evict() -> None:
    """Every rank drops its own files from the page cache (each emulated node's view)."""
    comm.Barrier()
    for f in ds.files:
        drop_cached(f)
    comm.Barrier()


loaders = {name: Loader(ds, 1024, preset=name, decode=False) for name in names}
times: dict[str, list[float]] = {name: [] for name in names}
for e in range(epochs):
    for name in names if e % 2 == 0 else names[::-1]:
        ld = loaders[name]
        ld.set_epoch(e)
        evict()
        t = time.perf_counter()
        for _b in ld:
            pass
        comm.Barrier()
        times[name].append(time.perf_counter() - t)
plans = {name: ld.stats().get("plan", ld.stats()["source"]) for name, ld in loaders.items()}
for ld in loaders.values():
    ld.close()
if comm.Get_rank() == 0:
    for name, v in times.items():
        print(
            f"{name:16s} " + " ".join(f"{x:.2f}" for x in v),
            f"| epochs 2-{epochs}: sum {sum(v[1:]):.2f} s, median {statistics.median(v[1:]):.3f} s",
            f"| {plans[name]}",
            flush=True,
        )
