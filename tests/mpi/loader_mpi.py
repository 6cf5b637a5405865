# SPDX-License-Identifier: Apache-2.0
"""Run under mpiexec: every rank iterates a Loader; rank 0 writes what was delivered.

    loader_mpi.py OUT.json --data PATH[,PATH...] --presets P1,P2 --batch B
                  [--stop K] [--state STATE.json] [--epochs E]

For each dataset and preset, every rank records (step, ids, SHA-256 of its bytes);
the lists are gathered with ``allgather`` (so all ranks agree) and rank 0 writes them,
with the state taken after ``--stop K`` steps (``--state`` resumes from one).
Datasets are opened as their ``.feedline-make.json`` manifest says.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os

from mpi4py import MPI

from feedline import Loader, open_dataset


def open_made(path: str, comm):
    with open(os.path.join(path, ".feedline-make.json")) as f:
        m = json.load(f)
    return open_dataset(path, format=m["format"], comm=comm, **m.get("open_options", {}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--data", required=True)
    ap.add_argument("--presets", default="feedline,tf,tf-pre,async,async-db")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--stop", type=int, default=-1)
    ap.add_argument("--state", default=None)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--source", default=None, help="force a source (node, direct, ...)")
    ap.add_argument("--memory-cap", default=None)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    results = {}
    for path in a.data.split(","):
        ds = open_made(path, comm)
        for preset in a.presets.split(","):
            rec = []
            state = None
            kw = {"source": a.source} if a.source else {}
            with Loader(
                ds, a.batch, preset=preset, seed=5, buffer=8, memory_cap=a.memory_cap, **kw
            ) as ld:
                assert ld.world.size == comm.Get_size() and ld.world.rank == comm.Get_rank()
                if a.state:
                    with open(a.state) as f:
                        ld.load_state_dict(json.load(f)[f"{path}|{preset}"])
                start_epoch = ld.epoch
                for epoch in range(start_epoch, start_epoch + a.epochs):
                    ld.set_epoch(epoch)
                    for b in ld:
                        raw = hashlib.sha256(b.data.tobytes()).hexdigest()[:16]
                        rec.append([epoch, b.step, b.ids.tolist(), raw])
                        if ld.step == a.stop:
                            state = ld.state_dict()
                            break
                steps = len(ld)
                stats = ld.stats()
            every = comm.allgather(rec)
            states = comm.allgather(state)
            assert all(s == states[0] for s in states), "ranks disagree on the state"
            results[f"{path}|{preset}"] = {
                "ranks": every,
                "state": states[0],
                "steps": steps,
                "n": len(ds),
                "nodes": ld.world.nodes,
                "source": stats["source"],
                "exposed_io_s": comm.allgather(stats["exposed_io_s"]),
            }
    if comm.Get_rank() == 0:
        with open(a.out, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
