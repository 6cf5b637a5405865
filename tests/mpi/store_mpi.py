# SPDX-License-Identifier: Apache-2.0
"""Under mpiexec: the DeepIO in-memory store (``source="store"``, the ``deepio-*``
presets) delivers what every rank reading for itself delivers, keeps R = 1 in memory
across epochs, survives ranks leaving a pass early, resumes, and shares load errors.

    store_mpi.py DATASET_DIR MODE
    MODE: check | seeds | exact | auto STATE | auto-resume STATE | error | slow-peers | late-close |
          out-of-step | interrupted
Prints STORE-OK / STORE-<MODE>-OK once per rank.
"""

from __future__ import annotations

import _thread
import json
import logging
import os
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

from feedline import FeedlineError, Loader, StorageError, open_dataset
from feedline.plan.assign_memory import layout_stream
from feedline.sources import store
from feedline.sources.store import StoreOutOfStepError, StorePeerFailed, StorePeerLeft

comm = MPI.COMM_WORLD
rank, P = comm.Get_rank(), comm.Get_size()
path, mode = sys.argv[1], sys.argv[2]
with open(os.path.join(path, ".feedline-make.json")) as f:
    m = json.load(f)
ds = open_dataset(path, format=m["format"], comm=comm, **m.get("open_options", {}))
N = len(ds)
B = 16


def batches(loader, stop_at=None):
    out = []
    for i, b in enumerate(loader):
        if stop_at is not None and i == stop_at:
            break
        out.append((b.ids.tolist(), bytes(np.ascontiguousarray(b.data).tobytes())))
    return out


def once(got):
    ids = [i for step in comm.allgather(got) for b in step for i in b[0]]
    assert sorted(ids) == list(range(N)), "not every sample exactly once"


if mode == "check":
    for preset, R in (("deepio-ordered", 1.0), ("deepio-opportunistic", 0.25)):
        kw = {"memory_fraction": R, "seed": 3, "decode": False}
        with (
            Loader(ds, B, preset=preset, **kw) as st,
            Loader(ds, B, preset=preset, source="direct", **kw) as ref,
        ):
            assert st.stats()["source"] == "store"
            read = []
            for e in range(2):
                st.set_epoch(e)
                ref.set_epoch(e)
                got, want = batches(st), batches(ref)
                assert got == want, f"{preset} R={R} epoch {e}: store != direct"
                once(got)
                read.append(st.stats()["storage_bytes"])
            s = st.stats()
            if R == 1.0:
                assert read[1] == read[0] > 0, read  # loaded once, served from memory
            else:
                # every round re-loaded per epoch (holes read through: not to the byte)
                assert read[1] - read[0] > 0.8 * read[0] > 0, read
                assert s["rounds_loaded"] >= 4
            # samples came from other ranks: of this node by shared memory, of other
            # (emulated) nodes by MPI_Get
            assert comm.allreduce(s["node_bytes"]) > 0 or P == 1
            if int(os.environ.get("FEEDLINE_NODES", "0") or 0) > 1:
                assert comm.allreduce(s["rma_bytes"]) > 0
            # rank 0 leaves epoch 2 after one step; the others still get every batch
            st.set_epoch(2)
            ref.set_epoch(2)
            want = batches(ref)
            got = batches(st, stop_at=1 if rank == 0 else None)
            assert got == want[: len(got)] and (rank == 0 or got == want)
            # every rank leaves epoch 3 after two steps, then epoch 4 runs whole
            st.set_epoch(3)
            batches(st, stop_at=2)
            st.set_epoch(4)
            ref.set_epoch(4)
            assert batches(st) == batches(ref)
            # resume mid-epoch from a state: the rest is bit-exact
            st.set_epoch(5)
            it = iter(st)
            for _ in range(3):
                next(it)
            state = st.state_dict()
            rest = [(b.ids.tolist(), bytes(np.ascontiguousarray(b.data).tobytes())) for b in it]
        with Loader(ds, B, preset=preset, **kw) as again:
            again.load_state_dict(state)
            assert batches(again) == rest, f"{preset}: resume differs"
    print(f"STORE-OK rank {rank}", flush=True)
elif mode == "seeds":
    # a progressive store switching seeds (states of other Loaders): slots sized for one
    # seed's rounds regrow, on every rank at the same pass, when another's need more;
    # the bytes stay those reading for itself delivers
    kw = {"load_rounds": 4, "chunk": 16, "decode": False}
    with (
        Loader(ds, B, preset="deepio-ordered", seed=5, **kw) as st,
        Loader(ds, B, preset="deepio-ordered", source="direct", seed=5, **kw) as ref,
    ):
        assert batches(st) == batches(ref)
        sizes = {tuple(np.diff(st._source._slot_at).tolist())}
        for seed in (6, 7, 5):
            with Loader(ds, B, preset="deepio-ordered", seed=seed, **kw) as other:
                state = other.state_dict()
            st.load_state_dict(state, strict=False)
            ref.load_state_dict(state, strict=False)
            got = batches(st)
            assert got == batches(ref), f"seed {seed}: store != direct"
            once(got)
            sizes.add(tuple(np.diff(st._source._slot_at).tolist()))
        held = comm.allgather(sorted(sizes))
        assert all(h == held[0] for h in held), "ranks sized the store differently"
    print(f"STORE-SEEDS-OK rank {rank} {len(sizes)} sizings", flush=True)
elif mode == "exact":
    # both modes, R = 1 and R < 1: the store delivers its plan (what reading for itself
    # delivers), every sample exactly once per epoch, and a resume mid-epoch is bit-exact;
    # the opportunistic mode serves from this rank's memory what the ordered one fetches
    # (R, load_rounds): R = 1 loaded at once, R < 1 in rounds, R = 1 loaded progressively
    # (epoch 0 in 3 rounds, all kept)
    configs = ((1.0, 0), (0.3, 0), (1.0, 3))
    gets = {}
    for preset in ("deepio-ordered", "deepio-opportunistic"):
        for R, K in configs:
            kw = {
                "memory_fraction": R,
                "load_rounds": K,
                "chunk": 16 if K else 0,
                "seed": 11,
                "decode": False,
            }
            with (
                Loader(ds, B, preset=preset, **kw) as st,
                Loader(ds, B, preset=preset, source="direct", **kw) as ref,
            ):
                for e in range(2):
                    st.set_epoch(e)
                    ref.set_epoch(e)
                    got = batches(st)
                    assert got == batches(ref), f"{preset} R={R} epoch {e}: store != direct"
                    once(got)
                s = st.stats()
                if K:  # every round loaded in epoch 0 and kept: epoch 1 read nothing
                    # (memory(1/3)'s rounds; the first ramped up when rounds are large)
                    lay = layout_stream(len(ds.index), st.strategy, 11, B)
                    assert lay is not None and lay.rounds >= K, lay
                    assert s["rounds_loaded"] == lay.rounds, (s["rounds_loaded"], lay.rounds)
                gets[preset, R, K] = (
                    comm.allreduce(s["rma_gets"]),
                    comm.allreduce(s["rma_bytes"] + s["node_bytes"]),
                )
                states = []
                for e in (0, 2) if K else (2,):  # progressive: mid-epoch 0 and later
                    st.set_epoch(e)
                    it = iter(st)
                    for _ in range(min(3, len(it) - 1)):
                        next(it)
                    states.append(
                        (
                            st.state_dict(),
                            [
                                (b.ids.tolist(), bytes(np.ascontiguousarray(b.data).tobytes()))
                                for b in it
                            ],
                        )
                    )
            for state, rest in states:
                with Loader(ds, B, preset=preset, **kw) as again:
                    again.load_state_dict(state)
                    assert batches(again) == rest, f"{preset} R={R} K={K}: resume differs"
    for R, K in configs:
        o, p = gets["deepio-ordered", R, K], gets["deepio-opportunistic", R, K]
        assert p[1] <= o[1] and p[0] <= o[0], (R, o, p)
        if P > 1:
            assert p[1] < o[1], (R, o, p)
    print(f"STORE-EXACT-OK rank {rank} {gets}", flush=True)
elif mode in ("auto", "auto-resume"):
    # the feedline preset's cost model chooses the store (store="auto"): exactly once,
    # loaded once, and a mid-epoch state resumes in another launch at another world
    # size (argv[3]: the state file) with the same remaining global batches
    state_file = sys.argv[3]

    def global_steps(got):
        return [
            sorted(i for part in parts for i in part)
            for parts in zip(*comm.allgather([g[0] for g in got]), strict=True)
        ]

    with Loader(ds, B, seed=11, decode=False) as ld:
        s = ld.stats()
        assert s["source"] == "store" and s["plan_store"] == "chosen", ld.explain()
        assert "-> won:" in ld.explain()
        if mode == "auto":
            read = []
            for e in range(2):
                ld.set_epoch(e)
                once(batches(ld))
                read.append(ld.stats()["storage_bytes"])
            assert read[1] == read[0] > 0, read  # R = 1: loaded once, served from memory
            ld.set_epoch(2)
            it = iter(ld)
            for _ in range(3):
                next(it)
            state = ld.state_dict()
            rest = global_steps([(b.ids.tolist(), None) for b in it])
            if rank == 0:
                with open(state_file, "w") as f:
                    json.dump({"state": state, "rest": rest}, f)
        else:
            with open(state_file) as f:
                saved = json.load(f)
            ld.load_state_dict(saved["state"])
            got = batches(ld)
            assert global_steps(got) == saved["rest"], "elastic resume of the store differs"
    print(f"STORE-{mode.upper()}-OK rank {rank}", flush=True)
elif mode == "slow-peers":
    # rank 0 leaves after one step and closes; the others need its shares of the rounds
    # left and take 0.15 s a step: close() waits for them (and says so) instead of
    # giving up on a timer
    store.STALL_S = 0.5
    warned = []
    logging.getLogger("feedline.store").addHandler(
        type("H", (logging.Handler,), {"emit": lambda self, r: warned.append(r.getMessage())})()
    )
    kw = {"memory_fraction": 0.25, "seed": 7, "decode": False}
    with Loader(ds, B, preset="deepio-ordered", source="direct", **kw) as ref:
        want = batches(ref)
    ld = Loader(ds, B, preset="deepio-ordered", **kw)
    got = []
    for b in ld:
        got.append((b.ids.tolist(), bytes(np.ascontiguousarray(b.data).tobytes())))
        if rank == 0:
            break
        time.sleep(0.15)
    t0 = time.monotonic()
    ld.close()
    waited = time.monotonic() - t0
    assert got == want[: len(got)] and (rank == 0 or got == want)
    if rank == 0:
        assert waited > 1.0 and warned and "waits until the other ranks" in warned[0], (
            waited,
            warned,
        )
    assert not ld._source._kept  # every rank closed within the grace: the window freed
    print(f"STORE-SLOW-PEERS-OK rank {rank} waited {waited:.1f}s", flush=True)
elif mode == "all-leave":
    # a progressive store (4 rounds, no C1): every rank leaves epoch 0 in its first round
    # and closes; their C2s say so and the rest of the pass is abandoned, not loaded
    kw = {"load_rounds": 4, "chunk": 16, "seed": 3, "decode": False}
    ld = Loader(ds, B, preset="deepio-ordered", **kw)
    it = iter(ld)
    for _ in range(2):
        next(it)
    del it
    ld.close()
    loaded = ld._source._st["rounds_loaded"]
    assert loaded < 4, loaded
    print(f"STORE-ALL-LEAVE-OK rank {rank} rounds {loaded}", flush=True)
elif mode == "late-close":
    # rank 1 closes long after the grace period: every rank keeps the window (one
    # atomic vote), nobody hangs in the collective free
    store.CLOSE_GRACE_S = 0.5
    ld = Loader(ds, B, preset="deepio-ordered", seed=2, decode=False)
    assert sum(len(b.ids) for b in ld) > 0
    if rank == 1:
        time.sleep(2.5)
    ld.close()
    kept = comm.allgather(ld._source._kept)
    assert kept == [True] * P, kept
    print(f"STORE-LATE-CLOSE-OK rank {rank}", flush=True)
elif mode == "out-of-step":
    # rank 0 iterates epoch 1 while the others iterate epoch 0: every rank raises
    kw = {"memory_fraction": 0.25, "seed": 7, "decode": False}
    with Loader(ds, B, preset="deepio-ordered", **kw) as ld:
        ld.set_epoch(1 if rank == 0 else 0)
        try:
            batches(ld)
        except StoreOutOfStepError as e:
            assert "not in the same pass" in str(e), e
        else:
            raise AssertionError("no StoreOutOfStepError")
        ld.set_epoch(3)  # back in step: the next pass is whole
        got = batches(ld)
        once(got)
    print(f"STORE-OUT-OF-STEP-OK rank {rank}", flush=True)
elif mode == "interrupted":
    # rank 0 leaves after one step; Ctrl-C while its close() waits for the others: they
    # raise StorePeerLeft together at their next round instead of hanging (rank 2, which
    # iterates slowly), or at their next pass (rank 1, which left after one step too)
    kw = {"memory_fraction": 0.25, "seed": 7, "decode": False}
    ld = Loader(ds, B, preset="deepio-ordered", **kw)
    if rank == 0:
        for _b in ld:
            break
        threading.Timer(0.5, _thread.interrupt_main).start()
        try:
            ld.close()
        except KeyboardInterrupt:
            pass
        else:
            raise AssertionError("close() was not interrupted")
        assert ld._source._gave_up
        print(f"STORE-INTERRUPTED-OK rank {rank}", flush=True)
    else:
        try:
            if rank == 1:
                for _b in ld:
                    break
                time.sleep(1.0)
                ld.set_epoch(1)
            for _b in ld:
                time.sleep(0.2)
        except StorePeerLeft as e:
            assert "rank 0" in str(e), e
            try:  # for good: no later pass either
                next(iter(ld))
            except StorePeerLeft:
                pass
            else:
                raise AssertionError("a later pass ran without rank 0") from e
            print(f"STORE-INTERRUPTED-OK rank {rank}", flush=True)
        else:
            raise AssertionError("no StorePeerLeft")
        ld.close()
else:
    _ = ds.index
    comm.Barrier()
    if rank == 0:
        os.unlink(ds.files[-1])
    comm.Barrier()
    # argv[3] "progressive": R = 1 loaded in 3 rounds, each read ahead of its C2
    knobs = {"memory_fraction": 0.5}
    if sys.argv[3:] == ["progressive"]:
        knobs = {"load_rounds": 3, "chunk": 16}
    try:
        with Loader(ds, B, preset="deepio-ordered", seed=1, **knobs) as ld:
            for _b in ld:
                pass
    except StorageError as e:
        assert e.path == ds.files[-1], e
        print(f"STORE-ERROR-OK rank {rank} own", flush=True)
    except StorePeerFailed as e:
        assert isinstance(e, FeedlineError)
        print(f"STORE-ERROR-OK rank {rank} peer: {e}", flush=True)
    else:
        print(f"NO ERROR on rank {rank}", flush=True)
