# SPDX-License-Identifier: Apache-2.0
"""mpiexec -n 2 python node_inplace.py OUT DIR: the node source reading with O_DIRECT.

Two datasets on one node: records of 100 KB in 3 files (the windows are widened to
whole blocks and land in place: only the files' tails go through the engine's bounce
buffer), and one sample per file (widening would split every file's tail into an
extent of its own, twice the extents the window's plan table holds: such windows stay
as they are instead of overflowing the table). Writes, per rank, the samples seen, the
samples whose bytes differ from the files, ``bounced_bytes`` and table overflows.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(__file__))
from loader_common import open_records, write_records

import feedline
import feedline.sources.node as node_source
from feedline import Loader

comm = MPI.COMM_WORLD
out, root = sys.argv[1], sys.argv[2]
overflows = [0]
pack = node_source._pack_ops


def counting_pack(ops, words):
    n = pack(ops, words)
    overflows[0] += n < 0
    return n


node_source._pack_ops = counting_pack

paths = None
if comm.rank == 0:
    paths, _ = write_records(os.path.join(root, "rec"), 600, 100_000, 3)
    os.makedirs(os.path.join(root, "files"), exist_ok=True)
    rng = np.random.default_rng(1)
    for i in range(160):
        size = int(rng.integers(66_000, 70_000))
        rng.integers(0, 256, size, dtype=np.uint8).tofile(
            os.path.join(root, "files", f"{i:03d}.bin")
        )
paths = comm.bcast(paths, root=0)

result = {}
for name, fmt, kw in (
    ("records", None, {}),
    ("files", "files", {"window_steps": 10}),
):
    if fmt is None:
        ds = open_records(paths, 100_000, comm)
    else:
        ds = feedline.open_dataset(os.path.join(root, "files"), format=fmt, comm=comm)
    files = list(ds.files)
    seen = wrong = 0
    with Loader(ds, 8, comm=comm, source="node", read="odirect", store="off", seed=2,
                decode=False, profile="local", **kw) as ld:  # fmt: skip
        for b in ld:
            lens = np.asarray(b.lengths)
            starts = np.concatenate([[0], np.cumsum(lens)])
            flat = np.asarray(b.data).reshape(-1)
            for i, sid in enumerate(np.asarray(b.ids).tolist()):
                fid, off, ln = ds.index.file_ids[sid], ds.index.offsets[sid], ds.index.lengths[sid]
                with open(files[int(fid)], "rb") as f:
                    f.seek(int(off))
                    want = np.frombuffer(f.read(int(ln)), dtype=np.uint8)
                wrong += not np.array_equal(flat[starts[i] : starts[i + 1]], want)
                seen += 1
        st = ld.stats()
    result[name] = {
        "samples": seen,
        "wrong": wrong,
        "bounced": st.get("bounced_bytes"),
        "storage": st.get("storage_bytes"),
        "threads": st.get("io_threads"),
        "engine": st.get("engine"),
        "files": len(files),
    }
result["overflows"] = overflows[0]
everyone = comm.gather(result, root=0)
if comm.rank == 0:
    with open(out, "w") as f:
        json.dump(everyone, f)
