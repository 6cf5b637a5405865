# SPDX-License-Identifier: Apache-2.0
"""Under mpiexec: a node reader's I/O error must reach every rank of the node, typed.

    loader_node_error.py DATASET_DIR
Rank 0 deletes one dataset file after the index is built; every rank must then raise
StorageError from the Loader (``source="node"``) and print NODE-ERROR-OK.
"""

from __future__ import annotations

import json
import os
import sys

from mpi4py import MPI

from feedline import Loader, StorageError, open_dataset

comm = MPI.COMM_WORLD
path = sys.argv[1]
with open(os.path.join(path, ".feedline-make.json")) as f:
    m = json.load(f)
ds = open_dataset(path, format=m["format"], comm=comm, **m.get("open_options", {}))
_ = ds.index
comm.Barrier()
if comm.Get_rank() == 0:
    os.unlink(ds.files[-1])
comm.Barrier()
try:
    with Loader(ds, 8, preset="feedline", source="node", seed=1) as ld:
        for _b in ld:
            pass
except StorageError as e:
    assert e.path == ds.files[-1], e
    print(f"NODE-ERROR-OK rank {comm.Get_rank()}", flush=True)
else:
    print(f"NO ERROR on rank {comm.Get_rank()}", flush=True)
