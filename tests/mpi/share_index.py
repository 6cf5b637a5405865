# SPDX-License-Identifier: Apache-2.0
"""Run under mpiexec: World.share_index builds once, shares the sidecar or the arrays,
and propagates errors from the builder to every rank.

Usage: mpiexec -n P python share_index.py DIR NODES MODE
MODE: sidecar (builder writes a sidecar) | nosidecar (arrays over the node comm) |
      fail (rank 0's build raises CorruptDataError) | failother (the last node's leader
      fails) | failload (the last rank fails loading the shared sidecar)
"""

from __future__ import annotations

import os
import sys

import numpy as np
from mpi4py import MPI

from feedline.dist import World
from feedline.errors import CorruptDataError
from feedline.index import Index, load_sidecar, write_sidecar
from feedline.plan import WorldSpec

comm = MPI.COMM_WORLD
P, rank = comm.Get_size(), comm.Get_rank()
root, M, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
FAILER = {
    "fail": 0,
    "failother": WorldSpec(P, max(M, 1)).ranks_of(max(M, 1) - 1).start,
    "failload": P - 1,
}.get(mode)
data = os.path.join(root, "data.bin")
if rank == 0:
    with open(data, "wb") as f:
        f.write(bytes(range(256)) * 40)
comm.Barrier()


class Owner:
    """Stands in for feedline.Dataset: _load_or_build loads a sidecar or builds one."""

    def __init__(self) -> None:
        self.sidecar_path = None
        self.built = 0
        self.loaded = 0

    def _load_or_build(self) -> Index:
        side = os.path.join(root, ".test.fidx")
        if rank == FAILER:
            raise CorruptDataError(data, 70 + rank, f"planted corruption ({mode})")
        if os.path.exists(side):
            self.loaded += 1
            self.sidecar_path = side
            return load_sidecar(side, root=root, files=[data], key="k")
        self.built += 1
        idx = Index([data], np.zeros(40, np.int32), np.arange(40) * 256, np.full(40, 256))
        if mode != "nosidecar":
            from feedline.index import fingerprint

            write_sidecar(side, idx, root=root, fingerprints=[fingerprint(data)], key="k")
            self.sidecar_path = side
        return idx


world = World.from_comm(comm, nodes=M)
owner = Owner()
try:
    idx = world.share_index(owner._load_or_build)
    err = None
except CorruptDataError as e:
    idx, err = None, (e.path, e.offset)
errs = comm.allgather(err)
if FAILER is not None:
    assert errs == [(data, 70 + FAILER)] * P, errs
else:
    assert errs == [None] * P, errs
    assert np.array_equal(idx.offsets, np.arange(40) * 256)
    built = comm.allgather(owner.built)
    loaded = comm.allgather(owner.loaded)
    assert sum(built) == (1 if mode == "sidecar" else M if M else 1), (
        built
    )  # once (per node without sidecar)
    if mode == "sidecar":
        assert built[0] == 1 and sum(loaded) == P - 1, loaded
        assert rank == 0 or not idx.offsets.flags.owndata  # mapped from the sidecar
    else:
        assert sum(loaded) == 0
world.close()
if rank == 0:
    print("OK share_index", P, M, mode)
