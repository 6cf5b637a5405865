# SPDX-License-Identifier: Apache-2.0
"""Run under mpiexec: World structure, polite collectives, node windows, tokens.

Usage: mpiexec -n P python world_checks.py NODES   (NODES 0 = real nodes, env = FEEDLINE_NODES)
Every check asserts through collectives, so all ranks agree on success.
"""

from __future__ import annotations

import itertools
import sys
import time

import numpy as np
from mpi4py import MPI

from feedline.dist import World
from feedline.plan import FlatRecords, get_strategy, make_plan

comm = MPI.COMM_WORLD
P, rank = comm.Get_size(), comm.Get_rank()
if sys.argv[1].startswith("env"):  # nodes from FEEDLINE_NODES, set by the launcher's env
    import os

    M = int(os.environ["FEEDLINE_NODES"])
    world = World.from_comm(comm)
else:
    M = int(sys.argv[1])
    world = World.from_comm(comm, nodes=M)
expect_M = M if M > 0 else 1  # one physical machine

# structure
assert world.size == P and world.rank == rank and world.nodes == expect_M
assert comm.allgather(world.node) == [r * expect_M // P for r in range(P)]
assert world.node_size == len(world.spec.ranks_of(world.node))
assert comm.allgather(world.is_leader) == [
    r == world.spec.ranks_of(world.spec.node_of(r)).start for r in range(P)
]
if world.is_leader:
    assert world.leader_comm.Get_size() == expect_M and world.leader_comm.Get_rank() == world.node
else:
    assert world.leader_comm is None
# the host: every rank of this job runs on this one machine, whatever nodes are emulated
# (the cost model's cpu term: ranks against the union of their cores)
import os  # noqa: E402

assert world.host_ranks == P
assert world.host_cores == len(set().union(*comm.allgather(set(os.sched_getaffinity(0)))))
assert world.expand_path("/mnt/node{node}/db") == f"/mnt/node{world.node}/db"
assert world.expand_path(["a{node}", "b"]) == [f"a{world.node}", "b"]

# polite collectives
world.barrier()
assert world.bcast({"x": 41 + 1} if rank == 0 else None) == {"x": 42}
assert world.allgather(rank * rank) == [r * r for r in range(P)]
assert world.bcast(np.arange(rank + 3) if rank == 1 % P else None, root=1 % P).tolist() == list(
    range(1 % P + 3)
)
seeds = comm.allgather(world.bcast_seed())
assert len(set(seeds)) == 1
assert comm.allgather(world.bcast_seed(1234)) == [1234] * P

# readers election
for k in (0, 1, 2):
    readers = world.readers(k)
    assert all(world.spec.node_of(r) == world.node for r in readers)
    assert len(readers) == (world.node_size if k == 0 else min(k, world.node_size))
    # every rank agrees on its node's readers
    assert len({tuple(x) for x in world.allgather(readers, comm=world.node_comm)}) == 1
n_readers = comm.allreduce(1 if world.is_reader(1) else 0)
assert n_readers == expect_M

# node shared window: the leader writes, everyone on the node sees it
with world.node_array((4, 5), np.int64) as shm:
    if world.is_leader:
        shm.array[:] = world.node * 100 + np.arange(20).reshape(4, 5)
    world.node_barrier()
    seen = int(shm.array.sum())
    world.node_barrier()
    # every rank writes its own row slot through the shared view
    if world.node_rank < 4:
        shm.array[world.node_rank, 0] = -1 - world.node_rank
    world.node_barrier()
    col = shm.array[:, 0].copy()
    world.node_barrier()
got = comm.allgather((world.node, seen, col.tolist()))
for node, s, c in got:
    assert s == node * 100 * 20 + sum(range(20))
    m = len(world.spec.ranks_of(node))
    assert c[: min(m, 4)] == [-1 - i for i in range(min(m, 4))]

# staggering tokens: one group reads at a time, in group order, every round
plan = make_plan(
    FlatRecords(4000, 8),
    world.spec,
    get_strategy("lmm-dio-prov-coal-stag", readers_per_node=0, stagger=2),
    batch_size=8 * P,
)
ROUNDS = 3
log = []
if rank in plan.readers:
    info = plan.stagger(rank)
    tok = world.token(info)
    for rnd in range(ROUNDS):
        with tok:
            t0 = time.monotonic()
            time.sleep(0.01)
            log.append((rnd, info.group, info.label, t0, time.monotonic()))
    tok.close()
logs = [e for part in comm.allgather(log) for e in part]
info0 = plan.stagger(plan.readers[0])
if info0.enabled:
    # for each label, the sequence of (round, group) intervals never overlaps and goes in order
    for label in range(info0.size):
        seq = sorted((e for e in logs if e[2] == label), key=lambda e: (e[0], e[1]))
        for a, b in itertools.pairwise(seq):
            assert b[3] >= a[4], (a, b)
    # at most `size` readers are inside the critical region at once
    events = sorted([(e[3], 1) for e in logs] + [(e[4], -1) for e in logs])
    depth = peak = 0
    for _, d in events:
        depth += d
        peak = max(peak, depth)
    assert peak <= info0.size, peak
assert len(logs) == ROUNDS * len(plan.readers)

world.barrier()
world.close()
if rank == 0:
    print("OK world", P, M)
