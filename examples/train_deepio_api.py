# SPDX-License-Identifier: Apache-2.0
"""Train a small CNN with DeepIO's portable API (§III-D): a seed file, each worker's
index array, and mini-batches read through a storage backend — no Loader.

    python examples/train_deepio_api.py --data /tmp/cifar_lmdb --epochs 2
    mpiexec -n 2 python examples/train_deepio_api.py --data /tmp/cifar_lmdb --backend files

Rank 0 writes the seed file once (``generate_seed``); every worker then derives its own
share of each epoch's order from it (``shuffle_rand``, the order the ``deepio-ordered``
Loader delivers with that seed) and reads it through the backend (``batch``: ``native``
is feedline's engine, ``files`` plain pread). Gradients are averaged over gloo when
there are several workers. ``--log`` writes the ids each worker trained on (for tests).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from feedline import deepio, open_dataset
from feedline.dist import launcher_comm


def mpi_comm():
    """COMM_WORLD when started by mpiexec/srun with several processes, else None (one
    process): feedline's launcher detection (feedline.dist.launch)."""
    return launcher_comm()


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 16 * 16, classes)

    def forward(self, x):
        return self.fc(F.max_pool2d(F.relu(self.c1(x)), 2).flatten(1))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data", required=True, help="a cifar10-large-shaped LMDB (made when missing)")
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64, help="global batch")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--backend", default="native", choices=("native", "files"))
    ap.add_argument("--seeds", default=None, help="seed file (default: next to --data)")
    ap.add_argument("--log", default=None)
    a = ap.parse_args()

    comm = mpi_comm()
    rank, size = (comm.Get_rank(), comm.Get_size()) if comm is not None else (0, 1)
    seeds = a.seeds or os.path.join(os.path.dirname(os.path.abspath(a.data)), "deepio-seeds.json")
    if rank == 0:
        if not os.path.exists(os.path.join(a.data, "data.mdb")):
            from feedline_tools.make import generate

            generate("cifar10-large", a.data, samples=a.samples, progress=False)
        deepio.generate_seed(a.epochs, seeds, seed=1)
    if size > 1:
        where = os.path.join(tempfile.mkdtemp(prefix="feedline-ddp-"), "s") if rank == 0 else None
        where = comm.bcast(where, root=0)
        dist.init_process_group("gloo", init_method=f"file://{where}", rank=rank, world_size=size)
        comm.Barrier()
        if rank == 0:
            shutil.rmtree(os.path.dirname(where), ignore_errors=True)

    ds = open_dataset(a.data)
    torch.manual_seed(0)
    model = SmallCNN()
    if size > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    per_worker = a.batch // size
    for epoch in range(a.epochs):
        ids = deepio.shuffle_rand(epoch, rank, seeds, n=len(ds), workers=size, batch_size=a.batch)
        total, n = 0.0, 0
        for mb in deepio.batch(ids, per_worker, dataset=ds, backend=a.backend):
            x, y = ds.decode(mb.data.reshape(-1), mb.lengths, mb.ids)
            x = torch.from_numpy(np.ascontiguousarray(x)).float().div_(255.0)
            y = torch.from_numpy(np.asarray(y)).long()
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(y)
            n += len(y)
            if a.log:
                with open(f"{a.log}.{rank}", "a") as f:
                    f.write(json.dumps({"epoch": epoch, "ids": mb.ids.tolist()}) + "\n")
        print(
            f"rank {rank} epoch {epoch}: loss {total / max(n, 1):.3f} over {n} samples", flush=True
        )
    if size > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
