# SPDX-License-Identifier: Apache-2.0
"""Under mpiexec (or alone): one Loader pass with a fault or a killed rank; every rank
reports how it ended. Used by tests/test_reliability_mpi.py and tests/test_faultfs.py.

    reliability_run.py DATA PRESET [--fault unlink] [--kill RANK:POINT[:N]]
                       [--hashes OUT] [--checkpoint CKPT] [--resume CKPT]
                       [--batch B] [--epochs E] [--timeout S] [--catch]

Each rank prints (and with ``--report PREFIX`` writes to PREFIX.RANK.txt) ``OUTCOME rank=R kind=ok|error type=T s=SECONDS msg=...`` and, with
``--hashes``, writes OUT.R.json: [[epoch, step, ids, sha256 of the batch's bytes]...].
``--fault unlink``: rank 0 deletes the last dataset file after the index is built
(a persistent ENOENT for whoever reads it). ``--kill R:POINT[:N]``: rank R SIGKILLs
itself at the N-th (default 1st) occurrence of POINT: ``step`` (after N batches),
``collective`` (inside a wait of a feedline collective), ``token`` (right after taking
the staggering token), ``handoff`` (inside a node-window wait). With ``--catch`` a
rank that meets a FeedlineError prints its outcome and exits normally (the exit guard
must then keep the job from hanging); without it the error escapes.
``--inject KIND:COUNT[:SECONDS]``: rank 0 tells the storage emulator whose view DATA
is to inject that fault into reads of ``data_batch*`` files once the index is built.
``--fail R:STEP``: rank R's source raises StorageError(EIO) at STEP (a failure on one
rank only). ``--user-allreduce``: a blocking ``allreduce`` after every batch, as a
training step's gradient averaging.
``--checkpoint`` writes rank 0's state after every batch; ``--resume`` loads one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time

from mpi4py import MPI

from feedline import FeedlineError, Loader, open_dataset

REPORT: list[str] = []


def _write(path: str, text: str) -> None:
    """Write *path* whole or not at all (a launcher may kill this process at any time:
    a report cut mid-write would fail the test's parse)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def report(rank: int, line: str) -> None:
    """Print the outcome line, and write it to REPORT[0].RANK.txt (a launcher that kills
    the job may drop the last lines of stdout)."""
    print(line, flush=True)
    if REPORT:
        _write(f"{REPORT[0]}.{rank}.txt", line + "\n")


def _die() -> None:
    if REPORT:  # the shared-memory files this job maps, for the leak check
        with open("/proc/self/maps") as f:
            shm = sorted({ln.split(None, 5)[-1].strip() for ln in f if "/dev/shm/" in ln})
        _write(f"{REPORT[0]}.shm", json.dumps([p.replace(" (deleted)", "") for p in shm]))
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def arm_kill(point: str, n: int) -> None:
    """Wrap the function that marks POINT so that its n-th call kills this process."""
    from feedline.dist import world as W
    from feedline.sources import node as N

    count = [0]

    def hit() -> None:
        count[0] += 1
        if count[0] == n:
            _die()

    if point == "collective":
        orig = W.World.allgather

        def allgather(self, obj, comm=None, **kw):
            hit()
            return orig(self, obj, comm, **kw)

        W.World.allgather = allgather
        orig_b = W.World.bcast

        def bcast(self, obj=None, root=0, comm=None, **kw):
            hit()
            return orig_b(self, obj, root, comm, **kw)

        W.World.bcast = bcast
    elif point == "token":
        orig_t = W.Token.acquire

        def acquire(self):
            orig_t(self)
            hit()

        W.Token.acquire = acquire
    elif point == "handoff":
        orig_e = N.NodeWindowSource._enter

        def enter(self, P, r):
            hit()
            return orig_e(self, P, r)

        N.NodeWindowSource._enter = enter
    elif point != "step":
        raise SystemExit(f"unknown kill point {point}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("preset")
    ap.add_argument("--fault", default=None)
    ap.add_argument("--inject", default=None)
    ap.add_argument("--kill", default=None)
    ap.add_argument("--hashes", default=None)
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--resume", default=None)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=0.0)
    ap.add_argument("--source", default=None)
    ap.add_argument("--catch", action="store_true")
    ap.add_argument("--report", default=None)
    ap.add_argument("--fail", default=None, help="RANK:STEP: that rank's source raises EIO")
    ap.add_argument("--user-allreduce", action="store_true", help="a blocking allreduce per step")
    a = ap.parse_args()
    if a.report:
        REPORT.append(a.report)
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    with open(os.path.join(a.data, ".feedline-make.json")) as f:
        m = json.load(f)
    ds = open_dataset(a.data, format=m["format"], comm=comm, **m.get("open_options", {}))
    _ = ds.index
    kill_step = -1
    if a.kill:
        parts = a.kill.split(":")
        victim, point = int(parts[0]), parts[1]
        n = int(parts[2]) if len(parts) > 2 else 1
        if rank == victim:
            if point == "step":
                kill_step = n
            else:
                arm_kill(point, n)
    if a.inject:  # emulator fault, after the index is built: KIND:COUNT[:SECONDS]
        comm.Barrier()
        if rank == 0:
            kind, count, *sec = a.inject.split(":")
            cmd = f"fault {kind} data_batch count={count}" + (f" seconds={sec[0]}" if sec else "")
            control = os.path.join(os.path.dirname(os.path.abspath(a.data)), ".feedline-control")
            with open(control, "w") as f:
                f.write("drop\n" + cmd + "\n")
        comm.Barrier()
    if a.fault == "unlink":
        comm.Barrier()
        if rank == 0:
            os.unlink(ds.files[-1])
        comm.Barrier()
    if a.fail and rank == int(a.fail.split(":")[0]):
        import importlib

        from feedline.errors import StorageError
        from feedline.sources import base as S

        for module in S.SOURCE_MODULES.values():  # every source, registered before patching
            importlib.import_module(module)
        at = int(a.fail.split(":")[1])
        for cls in list(S.SOURCES.values()):
            orig = cls.get

            def get(self, step, _orig=orig):
                if step == at:
                    raise StorageError(ds.files[0], 4096 * step, 5)
                return _orig(self, step)

            cls.get = get
    kw = {"source": a.source} if a.source else {}
    t0 = time.monotonic()
    rec = []
    done = 0
    try:
        with Loader(ds, a.batch, preset=a.preset, seed=3, timeout_s=a.timeout, **kw) as ld:
            if a.resume:
                with open(a.resume) as f:
                    ld.load_state_dict(json.load(f))
            start = ld.epoch
            for epoch in range(start, start + a.epochs):
                ld.set_epoch(epoch)
                for b in ld:
                    h = hashlib.sha256(b.data.tobytes())
                    rec.append([epoch, int(b.step), [int(i) for i in b.ids], h.hexdigest()])
                    done += 1
                    if a.user_allreduce:  # a training step's gradient allreduce (blocking)
                        comm.allreduce(done)
                    if a.checkpoint and rank == 0:
                        tmp = a.checkpoint + ".tmp"
                        with open(tmp, "w") as f:
                            json.dump(ld.state_dict(), f)
                        os.replace(tmp, a.checkpoint)
                    if done == kill_step:
                        _die()
    except FeedlineError as e:
        dt = time.monotonic() - t0
        msg = str(e).replace("\n", " ")[:300]
        report(rank, f"OUTCOME rank={rank} kind=error type={type(e).__name__} s={dt:.2f} msg={msg}")
        if a.hashes:
            with open(f"{a.hashes}.{rank}.json", "w") as f:
                json.dump(rec, f)
        if not a.catch:
            raise
        return
    dt = time.monotonic() - t0
    report(rank, f"OUTCOME rank={rank} kind=ok type=- s={dt:.2f} msg=steps {done}")
    if a.hashes:
        with open(f"{a.hashes}.{rank}.json", "w") as f:
            json.dump(rec, f)


if __name__ == "__main__":
    main()
