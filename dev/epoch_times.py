"""Seconds per epoch of Loader presets under mpiexec, page cache emptied before every
epoch (docs/loader.md, "The DeepIO store").

    mpiexec -n 4 python dev/epoch_times.py DATASET PRESET[:SOURCE],... [EPOCHS]
"""

from __future__ import annotations

import os
import sys
import time

from mpi4py import MPI

from feedline import Loader, open_dataset

comm = MPI.COMM_WORLD
path, presets = sys.argv[1], sys.argv[2].split(",")
epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 3
ds = open_dataset(path, comm=comm)


def evict() -> None:
    """Drop the dataset from the page cache (pages nobody has mapped)."""
    if comm.Get_rank() == 0:
        for f in ds.files:
            fd = os.open(f, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
    comm.Barrier()


for spec in presets:
    preset, _, source = spec.partition(":")
    kw = {"source": source} if source else {}
    with Loader(ds, 1024, preset=preset, decode=False, **kw) as ld:
        times = []
        for _ in range(epochs):
            evict()
            t = time.perf_counter()
            for _b in ld:
                pass
            comm.Barrier()
            times.append(time.perf_counter() - t)
        st = ld.stats()
    if comm.Get_rank() == 0:
        print(
            f"{spec:28s} seconds per epoch: " + " ".join(f"{x:.2f}" for x in times),
            f"| rank 0 read {st['storage_bytes'] / 1e6:.0f} MB",
            flush=True,
        )
