# SPDX-License-Identifier: Apache-2.0
"""What a ready batch costs the consumer in ``next()`` (docs/loader.md, "The
hand-over"): the median over STEPS steps, with SLEEP_MS of sleep before each ``next()``
(a training step; it leaves the caches cold, as training does). The first batch and
a warm-up of 0.2 s are not counted. With MPI it prints one line per rank.

    python dev/handoff.py DATASET [PRESET] [SLEEP_MS] [STEPS] [BATCH_PER_RANK]
    mpiexec -n 4 python dev/handoff.py DATASET async-db 1.5 200 4
"""

from __future__ import annotations

import statistics
import sys
import time

from feedline import Loader

path = sys.argv[1]
preset = sys.argv[2] if len(sys.argv) > 2 else "async-db"
sleep_s = float(sys.argv[3]) / 1e3 if len(sys.argv) > 3 else 1.5e-3
steps = int(sys.argv[4]) if len(sys.argv) > 4 else 200
per_rank = int(sys.argv[5]) if len(sys.argv) > 5 else 4
try:
    from mpi4py import MPI

    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
except ImportError:  # pragma: no cover - mpi4py is a dependency
    rank, size = 0, 1

with Loader(path, per_rank * size, preset=preset) as loader:
    it = iter(loader)
    next(it)
    time.sleep(0.2)  # the producer fills its budget: every batch below is ready
    waits = []
    for _ in range(min(steps, len(loader) - 1)):
        time.sleep(sleep_s)
        t0 = time.perf_counter()
        next(it)
        waits.append(time.perf_counter() - t0)
    run = loader._run
    bell = getattr(run, "_producer_bell", None)
    rings = bell.rings if bell is not None else "-"
    print(
        f"rank {rank}: {preset}, {len(waits)} steps of {per_rank}, {1e3 * sleep_s:g} ms apart: "
        f"median next() {1e6 * statistics.median(waits):.1f} us, "
        f"producer rung {rings} times",
        flush=True,
    )
