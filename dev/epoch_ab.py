# SPDX-License-Identifier: Apache-2.0
"""Two Loader presets in one job, their epochs interleaved, so that both see the same
machine (load, page cache, memory placement): seconds per epoch, page cache emptied
before every epoch (docs/deepio.md, "The issue's bars").

    mpiexec -n 4 python dev/epoch_ab.py DATASET PRESET_A PRESET_B [EPOCHS]

The Loaders are created A then B; swap the arguments to swap that too. Epoch e runs A
then B when e is even, B then A when odd. A preset may carry Loader options after a
colon, e.g. the node path against the per-rank one, both with O_DIRECT:

    mpiexec -n 4 python dev/epoch_ab.py DATASET feedline:read=odirect \
        feedline:read=odirect,source=node

DATASET may name emulated nodes' views, ``/tmp/emu/node{node}`` with FEEDLINE_NODES=M.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time

from mpi4py import MPI

from feedline import Loader, defaults, open_dataset
from feedline.io import evict as drop_cached
from feedline.pipeline.options import PipelineOptions

comm = MPI.COMM_WORLD
path, names = sys.argv[1], sys.argv[2:4]
epochs = int(sys.argv[4]) if len(sys.argv) > 4 else 10
if "{node}" in path:  # emulated nodes (docs/emulator.md): FEEDLINE_NODES=M, node = rank * M // P
    nodes = int(defaults.get("nodes")) or 1
    path = path.replace("{node}", str(comm.Get_rank() * nodes // comm.Get_size()))
ds = open_dataset(path, comm=comm)


def evict() -> None:
    """Every rank drops its own files from the page cache (each emulated node's view)."""
    comm.Barrier()
    for f in ds.files:
        drop_cached(f)
    comm.Barrier()


LOADER_OPTIONS = {f.name for f in dataclasses.fields(PipelineOptions)}  # given to the Loader


def options(name: str) -> tuple[dict, dict]:
    """``preset:key=value,...`` as Loader keyword arguments and, for keys that are
    knobs of ``feedline.defaults`` (``io_stage``...), knobs set around that Loader's
    epochs (numbers as numbers)."""
    preset, _, rest = name.partition(":")
    kw: dict = {"preset": preset}
    knobs: dict = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        knob = key in defaults.KNOBS and key not in LOADER_OPTIONS
        (knobs if knob else kw)[key] = int(value) if value.lstrip("-").isdigit() else value
    return kw, knobs


parsed = {name: options(name) for name in names}
loaders = {name: Loader(ds, 1024, decode=False, **parsed[name][0]) for name in names}
times: dict[str, list[float]] = {name: [] for name in names}
for e in range(epochs):
    for name in names if e % 2 == 0 else names[::-1]:
        ld = loaders[name]
        ld.set_epoch(e)
        evict()
        t = time.perf_counter()
        with defaults.set(parsed[name][1]):
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
            f"{name:36s} " + " ".join(f"{x:.2f}" for x in v),
            f"| epochs 2-{epochs}: sum {sum(v[1:]):.2f} s, median {statistics.median(v[1:]):.3f} s",
            f"| {plans[name]}",
            flush=True,
        )
