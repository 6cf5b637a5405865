# SPDX-License-Identifier: Apache-2.0
"""Run under mpiexec: every LMDBIO / MPI-Caffe preset through the Loader; rank 0 writes
what every rank delivered.

    lmdbio_check.py OUT.json --data LMDB --batch B [--presets P1,P2] [--epochs E]

For each run (a preset, and the ``lmdb`` baseline under each other assignment), every
rank records per step the ids, the SHA-256 of the raw bytes delivered and the SHA-256
of the same records read one by one with ``Dataset.read`` (the oracle); the records are
gathered with ``allgather`` and rank 0 writes them with every rank's statistics.
"""

from __future__ import annotations

import argparse
import hashlib
import json

import numpy as np
from mpi4py import MPI

from feedline import Loader, open_dataset
from feedline.sources.lmdbio import PRESETS, gather_stats, stats_table

# the lmdb baseline under the assignment of each other preset
BASELINES = {
    "lmdb@skip": {"assignment": "skip"},
    "lmdb@contiguous": {"assignment": "contiguous"},
    "lmdb@contiguous-node": {"assignment": "contiguous", "region": "node"},
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--data", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--options", default="{}", help="JSON knobs for every preset run")
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    ds = open_dataset(a.data, comm=comm)
    runs = {p: (p, json.loads(a.options)) for p in a.presets.split(",")}
    runs.update({k: ("lmdb", v) for k, v in BASELINES.items()})
    results = {}
    for name, (preset, knobs) in runs.items():
        rec = []
        with Loader(ds, a.batch, preset=preset, decode=False, comm=comm, **knobs) as ld:
            for epoch in range(a.epochs):
                ld.set_epoch(epoch)
                for b in ld:
                    raw = np.ascontiguousarray(b.data).tobytes()
                    want = b"".join(ds.read(int(i)) for i in b.ids)
                    rec.append(
                        [
                            epoch,
                            b.step,
                            b.ids.tolist(),
                            hashlib.sha256(raw).hexdigest()[:20],
                            hashlib.sha256(want).hexdigest()[:20],
                        ]
                    )
            rows = gather_stats(ld)
            info = {
                "steps": len(ld),
                "n": len(ds),
                "nodes": ld.world.nodes,
                "assignment": ld.strategy.assignment,
                "region": ld.strategy.region,
                "source": rows[0]["source"],
            }
        every = comm.allgather(rec)
        keep = (
            "reader", "mode", "seek_s", "io_s", "skew_s", "storage_bytes", "storage_ops",
            "redundant_bytes", "payload_read_bytes", "records_read", "seek_bytes", "seek_ops",
            "spec_prefetch_bytes", "spec_used_bytes", "spec_extra_bytes", "spec_miss_pages",
            "handoff_wait_s", "token_wait_s", "sync_wait_s", "stagger", "node_syncs",
            "ctx_switches", "peak_rss_bytes", "samples", "payload_bytes",
        )  # fmt: skip
        results[name] = dict(
            info,
            ranks=every,
            stats=[{k: r.get(k) for k in keep} for r in rows],
            table=stats_table(rows),
        )
    if comm.Get_rank() == 0:
        with open(a.out, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
