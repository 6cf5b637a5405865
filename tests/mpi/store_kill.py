# SPDX-License-Identifier: Apache-2.0
"""Under mpiexec without the launcher's auto-cleanup: one rank of the DeepIO store is
SIGKILLed mid-epoch; the survivors must raise StorePeerDied (or be aborted) quickly,
never hang in MPI_Get or a collective.

    store_kill.py DATASET_DIR PRESET R[/K] VICTIM OUT_DIR
Each survivor that raised writes OUT_DIR/raised-RANK (its message and time); one that
ran to the end writes OUT_DIR/finished-RANK (files: the launcher may drop the output of
a job that lost a rank).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from mpi4py import MPI

from feedline import Loader, open_dataset
from feedline.sources.store import StorePeerDied

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
path, preset, victim, out = sys.argv[1], sys.argv[2], int(sys.argv[4]), sys.argv[5]
# R, or R/K: R = 1 loaded progressively in K rounds (killed mid-load, in epoch 0)
R_text, _, K_text = sys.argv[3].partition("/")
R, K = float(R_text), int(K_text or 0)
kill_epoch = 0 if K else 1
with open(os.path.join(path, ".feedline-make.json")) as f:
    m = json.load(f)
ds = open_dataset(path, format=m["format"], comm=comm, **m.get("open_options", {}))
knobs = {"load_rounds": K, "chunk": 16} if K else {}
ld = Loader(ds, 16, preset=preset, memory_fraction=R, seed=1, decode=False, **knobs)


def _write(name: str, text: str) -> None:
    """Atomically (another survivor's exit may abort this rank mid-write): a file the
    test reads whole or not at all."""
    tmp = os.path.join(out, f".{name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, os.path.join(out, name))


t0 = time.monotonic()
try:
    for epoch in range(50):
        ld.set_epoch(epoch)
        for i, _b in enumerate(ld):
            if rank == victim and epoch == kill_epoch and i == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.002)
except StorePeerDied as e:
    _write(f"raised-{rank}", f"{time.monotonic() - t0:.1f} {e}")
    ld.close()
    sys.exit(3)  # the exit hook aborts the job (MPI cannot finalize with a dead rank)
_write(f"finished-{rank}", "finished")
