# SPDX-License-Identifier: Apache-2.0
"""Seconds per epoch of Loader presets under mpiexec, page cache emptied before every
epoch (docs/loader.md, "The DeepIO store").

    mpiexec -n 4 python dev/epoch_times.py DATASET PRESET[:SOURCE][@R],... [EPOCHS [MS]] [--warm]

(R: DeepIO's memory_fraction; MS: a sleep per step standing in for compute; --warm: the
page cache is emptied before the first epoch only, so later epochs may read from it.)
"""

from __future__ import annotations

import sys
import time

from mpi4py import MPI

from feedline import Loader, open_dataset
from feedline.io import evict as drop_cached

comm = MPI.COMM_WORLD
warm = "--warm" in sys.argv
argv = [a for a in sys.argv if a != "--warm"]
path, presets = argv[1], argv[2].split(",")
epochs = int(argv[3]) if len(argv) > 3 else 3
compute_s = float(argv[4]) / 1e3 if len(argv) > 4 else 0.0
ds = open_dataset(path, comm=comm)


def evict() -> None:
    """Drop the dataset from the page cache (pages nobody has mapped): every rank its own
    files, so that through the storage emulator every node view is emptied."""
    comm.Barrier()
    for f in ds.files:
        drop_cached(f)
    comm.Barrier()


for spec in presets:
    head, _, frac = spec.partition("@")
    preset, _, source = head.partition(":")
    kw: dict = {"source": source} if source else {}
    if frac:
        kw["memory_fraction"] = float(frac)
    with Loader(ds, 1024, preset=preset, decode=False, **kw) as ld:
        times = []
        for e in range(epochs):
            if e == 0 or not warm:
                evict()
            t = time.perf_counter()
            for _b in ld:
                if compute_s:
                    time.sleep(compute_s)
            comm.Barrier()
            times.append(time.perf_counter() - t)
        st = ld.stats()
    if comm.Get_rank() == 0:
        print(
            f"{spec:28s} seconds per epoch: " + " ".join(f"{x:.2f}" for x in times),
            f"| rank 0 read {st['storage_bytes'] / 1e6:.0f} MB, waited {st['exposed_io_s']:.2f} s"
            + (f" | plan: {st['plan']} (store {st['plan_store']})" if "plan" in st else ""),
            flush=True,
        )
