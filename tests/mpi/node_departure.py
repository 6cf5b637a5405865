# SPDX-License-Identifier: Apache-2.0
"""Under mpiexec (one emulated node): ranks of a node that do not iterate in lockstep.

    node_departure.py SCENARIO DATA_DIR N SIZE OUT_DIR

Every rank writes ``OUT_DIR/rank<r>.json`` with what it saw. The records' bytes are known
(``loader_common.record_bytes``), so every delivered record is checked against them,
and the ids of each step are compared with the ``direct`` source (every rank reading
for itself: the reference order).

Scenarios (rank 0 is the node's reader; ``readers_per_node=2`` adds rank P/2):
``all-break``     every rank breaks at step 3 of epoch 0, then runs epochs 1 and 2
``peer-break``    the last rank (not a reader) breaks at step 2 and closes its Loader
``reader-break``  rank 0 (reader) breaks at step 2 and starts epoch 1 at once; the
                  others finish epoch 0, then run epoch 1
``reader-close``  rank 0 breaks at step 2 and closes its Loader; the others finish
``reader-gone``   rank 0 closes at step 2; the others stall (sleep) longer than the
                  reader waits, then must get NodePeerLeft, not a hang
``extra-pass``    rank 0 starts and drops one pass more than the others: every rank
                  must raise NodeOutOfStepError instead of reading another epoch's data
``io-error``      rank 0 truncates every data file after step 1: every rank raises the
                  same typed error, at the same step
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time
import traceback

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(__file__))
from loader_common import open_records, record_bytes

import feedline.sources.node as node_mod
from feedline import Loader
from feedline.errors import FeedlineError
from feedline.plan import Strategy

node_mod.STALL_S = 1.5
node_mod.CLOSE_GRACE_S = 1.0

scenario, data_dir, N, SIZE, out_dir = (
    sys.argv[1],
    sys.argv[2],
    int(sys.argv[3]),
    int(sys.argv[4]),
    sys.argv[5],
)
comm = MPI.COMM_WORLD
rank, P = comm.Get_rank(), comm.Get_size()
paths = sorted(glob.glob(os.path.join(data_dir, "part*.bin")))
ds = open_records(paths, SIZE, comm=comm)
truth = record_bytes(N, SIZE)
B = 16
KW = dict(seed=3, decode=False, memory_cap=40_000, readers_per_node=2, prefetch_depth=2)
# the tiled column layout: an order independent of who reads, so the node source's ids
# can be checked against the direct source's (the feedline preset plans per reader)
TILES = Strategy(
    assignment="chunk",
    chunk_layout="column",
    chunk_bytes=2 << 20,
    coalesce_bytes=8 << 20,
    coalesce_gap=64 << 10,
    rl_floor=0.9,
)


def reference(epochs):
    """ids per (epoch, step) on this rank from the direct source."""
    out = {}
    with Loader(ds, B, preset=TILES, source="direct", **KW) as ld:
        for e in epochs:
            ld.set_epoch(e)
            for b in ld:
                out[(e, b.step)] = b.ids.tolist()
    return out


def check(b, ref, errors):
    ids = np.asarray(b.ids)
    want = ref.get((b.epoch, b.step))
    if ids.tolist() != want:
        errors.append(f"epoch {b.epoch} step {b.step}: ids {ids.tolist()} != {want}")
    data = np.asarray(b.data).reshape(len(ids), SIZE)
    if not np.array_equal(data, truth[ids]):
        errors.append(f"epoch {b.epoch} step {b.step}: wrong bytes")


ref = reference([0, 1, 2])
comm.Barrier()
res = {"rank": rank, "steps": {}, "errors": [], "raised": None}
t0 = time.monotonic()
try:
    ld = Loader(ds, B, preset=TILES, source="node", **KW)
    assert ld.stats()["source"] == "node", ld.stats()
    res["reader"] = None
    res["len"] = len(ld)
    if scenario == "all-break":
        for e in (0, 1, 2):
            ld.set_epoch(e)
            for b in ld:
                check(b, ref, res["errors"])
                res["steps"].setdefault(e, []).append(b.step)
                if e == 0 and b.step == 3:
                    break
        ld.close()
    elif scenario in ("peer-break", "reader-break", "reader-close", "reader-gone"):
        leaver = P - 1 if scenario == "peer-break" else 0
        ld.set_epoch(0)
        for b in ld:
            check(b, ref, res["errors"])
            res["steps"].setdefault(0, []).append(b.step)
            res["reader"] = ld.stats()["reader"]
            if rank == leaver and b.step == 2:
                break
            if scenario == "reader-gone" and rank != leaver and b.step == 2:
                time.sleep(node_mod.STALL_S + 2.0)  # longer than the reader waits
        if scenario == "reader-break":
            ld.set_epoch(1)  # the leaver starts the next epoch while the others finish
            for b in ld:
                check(b, ref, res["errors"])
                res["steps"].setdefault(1, []).append(b.step)
        t1 = time.monotonic()
        ld.close()
        res["close_s"] = time.monotonic() - t1
    elif scenario == "extra-pass":
        ld.set_epoch(0)
        if rank == 0:
            iter(ld).close()  # one pass more than the others: rank 0 is out of step
        for e in (0, 1):
            ld.set_epoch(e)
            for b in ld:
                check(b, ref, res["errors"])
                res["steps"].setdefault(e, []).append(b.step)
        ld.close()
    elif scenario == "io-error":
        ld.set_epoch(0)
        for b in ld:
            check(b, ref, res["errors"])
            res["steps"].setdefault(0, []).append(b.step)
            if rank == 0 and b.step == 1:
                for p in paths:
                    os.truncate(p, 0)
        ld.close()
    else:
        raise SystemExit(f"unknown scenario {scenario}")
except FeedlineError as e:
    res["raised"] = type(e).__name__
    res["message"] = str(e)
    res["at"] = max((s for ss in res["steps"].values() for s in ss), default=-1)
    ld.close()
except Exception as e:
    res["raised"] = f"UNEXPECTED {type(e).__name__}"
    res["message"] = traceback.format_exc()
res["elapsed_s"] = time.monotonic() - t0
res["node_syncs"] = int(ld._source.stats()["node_syncs"])
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(res, f)
comm.Barrier()
