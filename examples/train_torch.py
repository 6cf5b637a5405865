# SPDX-License-Identifier: Apache-2.0
"""Train a small CNN with PyTorch DDP on a feedline dataset, and resume mid-epoch.

    feedline make cifar10-large --samples 4096 --out /tmp/cifar_lmdb    # or --data below
    mpiexec -n 2 python examples/train_torch.py --data /tmp/cifar_lmdb --epochs 2 \
        --checkpoint /tmp/ck.pt --stop-after 10          # pretend the job is preempted
    mpiexec -n 2 python examples/train_torch.py --data /tmp/cifar_lmdb --epochs 2 \
        --checkpoint /tmp/ck.pt --resume                  # continues at step 10, exactly

Every rank trains on its own part of each global batch (feedline splits it); gradients
are averaged by DDP over gloo. The checkpoint holds the model, the optimizer and the
loader's state (a few hundred bytes); resuming replays the rest of the epoch bit-exactly
(at any number of ranks, the rest of the samples exactly once). Without ``mpiexec`` it
runs as one process. ``--log`` writes the sample ids each step trained on (for tests).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from feedline import FeedlineError, StorageError, open_dataset
from feedline.dist import launcher_comm, rank_from_env
from feedline.torch import FeedlineDataset


def mpi_comm():
    """COMM_WORLD when started by mpiexec/srun with several processes, else None (one
    process): feedline's launcher detection (feedline.dist.launch)."""
    return launcher_comm()


def init_ddp(comm) -> tuple[int, int]:
    """torch.distributed over gloo; the rendezvous is a file rank 0 names (no port race)."""
    rank, size = (comm.Get_rank(), comm.Get_size()) if comm is not None else (0, 1)
    if size > 1:
        store = (
            os.path.join(tempfile.mkdtemp(prefix="feedline-ddp-"), "store") if rank == 0 else None
        )
        store = comm.bcast(store, root=0)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=size)
        comm.Barrier()  # everyone has joined: the rendezvous directory can go
        if rank == 0:
            shutil.rmtree(os.path.dirname(store), ignore_errors=True)
    return rank, size


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 8 * 8, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return self.fc(x.flatten(1))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data", required=True, help="a cifar10-large-shaped LMDB (made when missing)")
    ap.add_argument(
        "--samples", type=int, default=2048, help="samples to make when --data is missing"
    )
    ap.add_argument("--batch", type=int, default=128, help="global batch")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--preset", default="feedline")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument(
        "--checkpoint", default=None, help="where to save model + optimizer + loader state"
    )
    ap.add_argument(
        "--stop-after", type=int, default=0, help="save and exit after N steps (preemption)"
    )
    ap.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    ap.add_argument("--log", default=None, help="append the ids of each step (JSON lines, rank 0)")
    ap.add_argument("--fail-after", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--fail-rank", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    try:
        train(a)
    except FeedlineError as e:
        # Let it end the process: feedline's exit hook then ends the job (MPI_Abort when
        # the other ranks wait in a collective this rank no longer joins), see
        # docs/reliability.md. Catching it and returning normally would hang there.
        rank = rank_from_env()
        print(f"rank {rank}: data error: {e}", file=sys.stderr, flush=True)
        raise


def train(a) -> None:

    comm = mpi_comm()
    rank, size = init_ddp(comm)
    if rank == 0 and not os.path.exists(os.path.join(a.data, "data.mdb")):
        from feedline_tools.make import generate

        generate("cifar10-large", a.data, samples=a.samples, progress=False)
    if comm is not None:
        comm.Barrier()

    torch.manual_seed(0)
    model = SmallCNN()
    if size > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)

    ds = open_dataset(a.data, comm=comm)
    loader = FeedlineDataset(ds, a.batch, preset=a.preset, seed=1, comm=comm, with_ids=True)
    start_epoch = 0
    if a.resume and a.checkpoint and os.path.exists(a.checkpoint):
        ck = torch.load(a.checkpoint, weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        loader.load_state_dict(ck["loader"])
        start_epoch = ck["loader"]["epoch"]
        if rank == 0:
            print(f"resumed at epoch {start_epoch} step {ck['loader']['step']}", flush=True)

    steps_done = 0
    for epoch in range(start_epoch, a.epochs):
        loader.set_epoch(epoch)
        total, correct, n = 0.0, 0, 0
        for x, y, ids in loader:
            x = x.float().div_(255.0)
            y = y.long()
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(y)
            correct += int((logits.detach().argmax(1) == y).sum())
            n += len(y)
            steps_done += 1
            if a.fail_after and steps_done == a.fail_after and rank == a.fail_rank:
                # for tests: pretend this rank's storage failed (as a persistent EIO would)
                raise StorageError(ds.files[0], 0, errno.EIO)
            if a.log:
                every = comm.allgather(ids.tolist()) if comm is not None else [ids.tolist()]
                if rank == 0:
                    with open(a.log, "a") as f:
                        f.write(
                            json.dumps(
                                {
                                    "epoch": epoch,
                                    "step": loader.state_dict()["step"] - 1,
                                    "ids": every,
                                }
                            )
                            + "\n"
                        )
            if a.stop_after and steps_done == a.stop_after:
                if a.checkpoint and rank == 0:
                    torch.save(
                        {
                            "model": model.state_dict(),
                            "opt": opt.state_dict(),
                            "loader": loader.state_dict(),
                        },
                        a.checkpoint,
                    )
                if rank == 0:
                    print(
                        f"stopped after {steps_done} steps; checkpoint {a.checkpoint}", flush=True
                    )
                loader.close()
                if size > 1:
                    dist.destroy_process_group()
                return
        if rank == 0:
            st = loader.stats()
            print(
                f"epoch {epoch}: loss {total / max(n, 1):.3f} acc(rank 0) {correct / max(n, 1):.2f} "
                f"exposed I/O {st['exposed_io_s']:.3f} s, read {st['storage_bytes'] / 1e6:.1f} MB "
                f"in {st['storage_ops']} ops ({st['source']})",
                flush=True,
            )
    if a.checkpoint and rank == 0:
        torch.save(
            {"model": model.state_dict(), "opt": opt.state_dict(), "loader": loader.state_dict()},
            a.checkpoint,
        )
    loader.close()
    if size > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
