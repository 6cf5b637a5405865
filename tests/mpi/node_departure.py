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
``reader-break-slow``  the same, with rank 0 pausing 0.3 s in its next ``start`` between
                  writing the new pass's key and publishing that it entered the pass
                  (where a preempted process stops; the others poll every 0.5 ms)
``reader-close``  rank 0 breaks at step 2 and closes its Loader; the others finish
``reader-gone``   rank 0 closes at step 2; the others stall (sleep) longer than the
                  reader waits, then must get NodePeerLeft, not a hang
``late-read``     rank 2 (the second reader) breaks at step 3 of epoch 0, the others in the
                  second last window, then all run epochs 1 and 2; rank 2's read of the
                  last window of the pass it left lands late, after the others left
                  that pass, while the next pass reads into the halves
``reopen``        every rank runs epochs 0 and 1, closes its Loader, and runs epochs 0
                  and 1 again with a new Loader, whose node window holds the old one's
                  bytes at allocation (as MPICH's does with one rank per node)
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
import threading
import time
import traceback
from concurrent.futures import Future

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


def slow_pass_entry() -> None:
    """Pause this rank between writing a new pass's key and publishing its entry."""
    publish = node_mod.NodeWindowSource._publish

    def slow(self, word, value):
        entering = value % node_mod._PASS_STRIDE == 0 and value >= node_mod._enc(2, 0)
        if word == self._w_pos + self._me and entering:
            time.sleep(0.3)
        publish(self, word, value)

    node_mod.NodeWindowSource._publish = slow


def recycled_windows() -> None:
    """A new node window starts with the bytes of the last one this process freed.

    MPI does not zero ``Win.Allocate_shared`` memory; with one rank per node MPICH
    allocates it privately and the allocator hands a freed window's memory back (seen:
    every byte of a 64 KiB window, 3 of 3 allocations)."""
    from feedline.dist import world as W

    last: dict[str, np.ndarray] = {}
    free, allocate = W.NodeArray.free, W.World.node_array

    def keep(self):
        last["bytes"] = self.array.view(np.uint8).reshape(-1).copy()
        free(self)

    def node_array(self, shape, dtype=np.uint8, *, owner=0):
        arr = allocate(self, shape, dtype, owner=owner)
        old = last.pop("bytes", None)
        if old is not None and self.node_rank == owner:
            flat = arr.array.view(np.uint8).reshape(-1)
            n = min(len(flat), len(old))
            flat[:n] = old[:n]
        return arr

    W.NodeArray.free = keep
    W.World.node_array = node_array


LATE: list[bool] = []  # late-read: per late landing, whether every rank had left its pass


def _wait_for(cond, limit_s: float = 10.0) -> bool:
    t = time.monotonic()
    while not cond():
        if time.monotonic() - t > limit_s:
            return False
        time.sleep(0.01)
    return True


def late_serving_reads(flag: str) -> None:
    """The read of the last window of a pass this rank left lands late: its bytes are
    written into the half again once every other rank has left that pass (and 0.2 s
    more), and only then does the read complete. *flag* is created when that read is
    submitted (the others wait for it before they leave)."""
    read_window = node_mod.NodeWindowSource._read_window

    def late(self, this_pass, r):
        fut = read_window(self, this_pass, r)
        last = r == len(this_pass.steps) - 1
        if not (last and threading.current_thread().name.endswith("node-serve")):
            return fut
        fut.result()
        base = sum(o.nbytes for o in this_pass.ops[r][: self._my])
        view = self._halves[r % 2, base : base + this_pass.ops[r][self._my].nbytes]
        landed, done = view.copy(), Future()
        gone = node_mod._enc(this_pass.gen, node_mod._DEPARTED)

        def others_left() -> bool:
            pos = self._pos_all()
            pos[self._me] = gone
            return bool((pos >= gone).all())

        def land():
            left = _wait_for(others_left)
            time.sleep(0.2)  # the next pass's readers read into the halves meanwhile
            LATE.append(left)
            view[:] = landed
            done.set_result(None)

        threading.Thread(target=land, daemon=True).start()
        open(flag, "w").close()
        return done

    node_mod.NodeWindowSource._read_window = late


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


if scenario == "reader-break-slow":
    scenario = "reader-break"
    if rank == 0:
        slow_pass_entry()
if scenario == "reopen":
    recycled_windows()
LATE_FLAG = os.path.join(out_dir, "late-read-submitted")
if scenario == "late-read" and rank == 2:
    late_serving_reads(LATE_FLAG)
ref = reference([0, 1, 2])
comm.Barrier()
res = {"rank": rank, "steps": {}, "errors": [], "raised": None}
t0 = time.monotonic()
try:
    ld = Loader(ds, B, preset=TILES, source="node", **KW)
    assert ld.stats()["source"] == "node", ld.stats()
    res["reader"] = None
    res["len"] = len(ld)
    if scenario in ("all-break", "late-read"):
        for e in (0, 1, 2):
            ld.set_epoch(e)
            leave = 3
            for b in ld:
                check(b, ref, res["errors"])
                res["steps"].setdefault(e, []).append(b.step)
                if scenario == "late-read" and rank != 2:
                    wins = ld._source._pass.steps  # the pass's windows (ranges of steps)
                    # the second last window's last step: the producer (read-ahead 2)
                    # then waits for the last window, pumping this rank's reads meanwhile
                    # (rank 0 plans the window whose read rank 2 submits late)
                    leave = wins[-1].start - 1
                    res["windows"] = len(wins)
                if e == 0 and b.step == leave:
                    if scenario == "late-read" and rank != 2:
                        # rank 2 has submitted its (late) read of the last window
                        res["flag"] = _wait_for(lambda: os.path.exists(LATE_FLAG))
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
    elif scenario == "reopen":
        for _ in range(2):
            for e in (0, 1):
                ld.set_epoch(e)
                for b in ld:
                    check(b, ref, res["errors"])
                    res["steps"].setdefault(e, []).append(b.step)
            res["node_syncs_first"] = int(ld._source.stats()["node_syncs"])
            ld.close()
            ld = Loader(ds, B, preset=TILES, source="node", **KW)
        ld.close()
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
res["late"] = LATE
res["node_syncs"] = int(ld._source.stats()["node_syncs"])
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(res, f)
comm.Barrier()
