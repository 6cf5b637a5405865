# SPDX-License-Identifier: Apache-2.0
"""DeepIO's distributed in-memory store (``source="store"``, the ``deepio-*`` presets)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from feedline import ConfigError, Loader, open_dataset
from feedline.sources.store import STORE_GAP, share_bytes
from feedline_tools.bench.harness import mpiexec_command
from feedline_tools.make import generate

HERE = os.path.dirname(__file__)


@pytest.fixture(scope="module")
def cifar(tmp_path_factory):
    return generate(
        "cifar10-large", str(tmp_path_factory.mktemp("st") / "c"), samples=700, progress=False
    )


def _epoch(loader):
    return [(b.ids.copy(), np.ascontiguousarray(b.data).copy()) for b in loader]


def _same(a, b):
    return len(a) == len(b) and all(
        np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) for x, y in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("R", [0.25, 0.5])
def test_a_small_dataset_keeps_the_memory_fraction_it_was_given(tmp_path, R):
    """32 records at R = 0.25 made one unit of 64 samples: one round, R = 1 in effect,
    silently. Units shrink so that every round holds R of the dataset: 1/R rounds an
    epoch, each loaded from storage again."""
    from feedline.plan.rl import memory_unit

    n, L = 32, 4096
    path = tmp_path / "r.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, n * L, dtype=np.uint8).tobytes())
    ds = open_dataset(str(path), format="records", record_bytes=L)
    assert memory_unit(n, R) * round(1 / R) * 2 <= n  # at least 2 units a round
    assert memory_unit(100_000, R) == 64 and memory_unit(n, 1.0) == n  # as before
    with Loader(ds, 4, preset="deepio-ordered", memory_fraction=R, decode=False) as ld:
        for e in range(2):
            ld.set_epoch(e)
            ids = np.concatenate([b.ids for b in ld])
            assert np.array_equal(np.sort(ids), np.arange(n))
        st = ld.stats()
    assert st["rounds_loaded"] == 2 * round(1 / R)
    assert st["storage_bytes"] == 2 * n * L  # every epoch loads the dataset again
    assert st["rl"] < 1.0


def test_a_small_progressive_store_serves_the_rounds_it_loaded(tmp_path, monkeypatch):
    """load_rounds=K on a small dataset: epoch 0's memory(1/K) order keeps the store's
    unit (64), so its rounds are the ones the store loads. With memory(1/K)'s own smaller
    unit the round counts agreed (4) while the rounds did not, and steps were served from
    rounds not yet loaded: 96 of 256 samples had other bytes. The loads are held back to
    the steps that need them (no read-ahead), so nothing hides a mismatch."""
    from feedline.plan import WorldSpec, get_strategy, make_plan
    from feedline.plan.assign_memory import layout_stream
    from feedline.sources.store import StoreSource

    n, L = 256, 4096
    path = tmp_path / "r.bin"
    path.write_bytes(np.random.default_rng(1).integers(0, 256, n * L, dtype=np.uint8).tobytes())
    ds = open_dataset(str(path), format="records", record_bytes=L)
    strat = get_strategy("deepio-ordered", load_rounds=4)
    lay = layout_stream(n, strat, 3, 8)
    plan0 = make_plan(ds.index, WorldSpec(1, 1), strat, 3, 0, 8)
    assert lay is not None and plan0._stream.g == lay.g == 64
    assert np.array_equal(plan0._stream.cuts, lay.cuts)
    monkeypatch.setattr(StoreSource, "_progress", lambda self: None)
    kw = {"preset": "deepio-ordered", "load_rounds": 4, "decode": False, "seed": 3}
    with Loader(ds, 8, **kw) as st, Loader(ds, 8, source="direct", **kw) as ref:
        for e in range(2):
            st.set_epoch(e)
            ref.set_epoch(e)
            assert _same(_epoch(st), _epoch(ref)), e
        assert st.stats()["rounds_loaded"] == 4


@pytest.mark.parametrize("preset", ["deepio-ordered", "deepio-opportunistic"])
@pytest.mark.parametrize("R", [1.0, 0.25])
def test_store_delivers_the_plan_and_keeps_r1_in_memory(cifar, preset, R):
    ds = open_dataset(cifar)
    kw = {"memory_fraction": R, "seed": 5, "decode": False}
    with (
        Loader(ds, 32, preset=preset, **kw) as st,
        Loader(ds, 32, preset=preset, source="direct", **kw) as ref,
    ):
        assert st.stats()["source"] == "store"
        read = []
        for e in range(2):
            st.set_epoch(e)
            ref.set_epoch(e)
            got = _epoch(st)
            assert _same(got, _epoch(ref))
            ids = np.sort(np.concatenate([g[0] for g in got]))
            assert np.array_equal(ids, np.arange(len(ds)))
            read.append(st.stats()["storage_bytes"])
        s = st.stats()
    payload = int(ds.index.lengths.sum())
    # loads read through LMDB's holes (page headers and tails): the file's span
    ix = ds.index
    extents = [np.asarray(a, dtype=np.int64) for a in (ix.file_ids, ix.offsets, ix.lengths)]
    disk = int(share_bytes(*extents, np.arange(len(ds)), 1, STORE_GAP)[0])
    assert disk > 1.2 * payload
    if R == 1.0:
        assert read == [disk, disk]  # loaded once; epoch 2 from memory
        assert s["store_bytes"] == disk and s["rounds_loaded"] == 1
        assert s["storage_ops"] <= 8  # 700 records in one merged extent, not 700 reads
    else:
        assert payload < read[0] <= disk and payload < read[1] - read[0] <= disk
        assert s["storage_ops"] <= 2 * 11  # at most one read per unit of 64
        assert s["rounds_loaded"] == 8  # 11 units of 64, 3 per round: 4 rounds x 2
        assert s["store_bytes"] < disk  # two slots of ~R of the dataset
    assert s["shares_uncoalesced"] == 0
    assert s["local_bytes"] == 2 * payload and s["rma_bytes"] == s["node_bytes"] == 0


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
    """4,000 records with lognormal lengths (sigma 0.5 around 3 KB: as spread as JPEGs)."""
    from uneven import write_uneven_lmdb

    path = str(tmp_path_factory.mktemp("st") / "uneven")
    write_uneven_lmdb(path, 4000, 3000, 0.5, seed=0)
    return path


def test_progressive_slots_hold_their_rounds_not_the_longest_records(uneven):
    """A progressive store's layout is fixed by its seed: each slot holds its round's
    largest share (+2%), not a share of the dataset's longest records. Another seed's
    state, loaded, may regrow the store: the bytes stay exact."""
    from feedline.sources.store_plan import _SEED_MARGIN, _Rounds

    ds = open_dataset(uneven)
    ix = ds.index
    fid, off, ln = (np.asarray(a, dtype=np.int64) for a in (ix.file_ids, ix.offsets, ix.lengths))
    kw = {"load_rounds": 4, "decode": False}
    with (
        Loader(ds, 32, preset="deepio-ordered", seed=5, **kw) as st,
        Loader(ds, 32, preset="deepio-ordered", source="direct", seed=5, **kw) as ref,
    ):
        assert _same(_epoch(st), _epoch(ref))
        rounds = _Rounds(st._source._plan)
        assert rounds.progressive and rounds.count >= 4
        exact = np.array(
            [
                share_bytes(fid, off, ln, rounds.ids(r), 1, STORE_GAP).max()
                for r in range(rounds.count)
            ]
        )
        held = np.diff(st._source._slot_at)
        assert (held >= exact).all() and (held <= np.ceil(exact * _SEED_MARGIN)).all()
        # the bound for every seed (before): the rounds' most records, the longest
        # ones, and the dataset's proportion of holes
        disk = int(share_bytes(fid, off, ln, np.arange(len(ds)), 1, STORE_GAP)[0])
        per = np.diff(rounds.stream.cuts) * rounds.stream.g
        longest = np.concatenate([[0], np.cumsum(np.sort(ln)[::-1])])[per]
        assert held.sum() < 0.6 * longest.sum() * disk / ln.sum()
        assert held.sum() < 1.05 * disk  # the dataset's span: what R = 1 at once holds
        assert st.stats()["shares_uncoalesced"] == 0
        for seed in (6, 7):  # other layouts: regrown when a round needs more, still exact
            with Loader(ds, 32, preset="deepio-ordered", seed=seed, **kw) as other:
                state = other.state_dict()
            st.load_state_dict(state, strict=False)
            ref.load_state_dict(state, strict=False)
            assert _same(_epoch(st), _epoch(ref)), seed


def test_plan_shows_what_the_loader_runs_when_the_stores_slots_overflow(uneven):
    """A cap the model's equal shares fit at R = 0.25, but not that store's slots (sized
    for any seed: the longest records): the Loader chooses again without the store, and
    ``feedline plan DATASET`` shows the same plan, with the reason."""
    from feedline.cli import build_parser
    from feedline.plan.cli import compute

    ds = open_dataset(uneven)
    payload = int(ds.index.lengths.sum())
    with Loader(ds, 64, decode=False, memory_cap=10 * payload) as probe:
        fixed = probe.memory_cap - probe._read_cap()  # read-ahead batches and index
    # left for reading: the payload. R = 1 needs the file's span (1.45x), R = 0.25 by the
    # model's equal shares 0.74x, by its slots for any seed 1.3x
    # (a parallel file system: its latency makes the store's few large reads win)
    from feedline.io.engine import BOUNCE_BYTES

    cap = payload + fixed + 4 * BOUNCE_BYTES  # and the store reader's 4 bounce buffers
    with Loader(ds, 64, decode=False, memory_cap=cap, profile="parallel") as ld:
        s = ld.stats()
        assert s["source"] == "direct" and "memory cap: the store's slots" in s["plan_store"]
        ran = ld.strategy.to_dict() | {"read": None}  # resolved by the Loader after
        read_cap = ld._read_cap()  # the cap less read-ahead batches and index
    argv = ["plan", uneven, "--batch", "64", "--memory-cap", str(read_cap), "--preset", "feedline"]
    args = build_parser().parse_args([*argv, "--profile", "parallel"])
    out = compute(args)
    assert out["choice"]["strategy"] | {"read": None} == ran
    assert "not a candidate (memory cap: the store's slots and read buffers need" in out["_explain"]


@pytest.mark.parametrize(("R", "gap"), [(1.0, 0), (1.0, 64), (0.25, 1 << 20)])
def test_store_loads_read_through_holes_or_record_by_record(cifar, R, gap):
    """The same bytes whatever the gap: record by record (gap 64 B < LMDB's holes), one
    merged read, or a share whose merged reads would outgrow its slot (a 1 MiB gap
    spans the units a round left out) read record by record instead."""
    ds = open_dataset(cifar)
    kw = {"memory_fraction": R, "seed": 3, "decode": False}
    with (
        Loader(ds, 32, preset="deepio-ordered", coalesce_gap=gap, **kw) as st,
        Loader(ds, 32, preset="deepio-ordered", source="direct", **kw) as ref,
    ):
        assert _same(_epoch(st), _epoch(ref))
        s = st.stats()
    if gap == 64:
        assert s["storage_ops"] == len(ds) and s["storage_bytes"] == int(ds.index.lengths.sum())
    elif gap == 0:  # STORE_GAP
        assert s["storage_ops"] <= 8
    else:
        # some rounds' shares did not fit merged: those were read record by record
        assert s["shares_uncoalesced"] > 0 and s["storage_ops"] >= 64


def test_store_resumes_and_stops_early(cifar):
    ds = open_dataset(cifar)
    kw = {"memory_fraction": 0.25, "seed": 1, "decode": False}
    with Loader(ds, 32, preset="deepio-ordered", **kw) as st:
        it = iter(st)
        for _ in range(4):
            next(it)
        state = st.state_dict()
        rest = [(b.ids.copy(), b.data.copy()) for b in it]
        st.set_epoch(1)
        for i, _b in enumerate(st):  # leave a pass early, then run one whole
            if i == 2:
                break
        st.set_epoch(2)
        assert sum(len(b.ids) for b in st) == len(ds)
    with Loader(ds, 32, preset="deepio-ordered", **kw) as again:
        again.load_state_dict(state)
        assert _same(_epoch(again), rest)


def test_store_that_does_not_fit_is_refused_with_the_knob_to_turn(cifar):
    ds = open_dataset(cifar)
    with pytest.raises(ConfigError, match="memory_fraction"):
        Loader(ds, 32, preset="deepio-ordered", memory_cap="2MB")  # 2.6 MB of samples
    Loader(ds, 32, preset="deepio-ordered", memory_fraction=0.1, memory_cap="2MB").close()


def test_circular_last_step_wraps_with_r1_and_is_refused_below(cifar):
    # 700 samples, B=64: the last step takes 36 samples from the start of the order
    ds = open_dataset(cifar)
    kw = {"seed": 4, "decode": False, "circular": True}
    with (
        Loader(ds, 64, preset="deepio-ordered", **kw) as st,
        Loader(ds, 64, preset="deepio-ordered", source="direct", **kw) as ref,
    ):
        got = _epoch(st)
        assert _same(got, _epoch(ref))
        assert sum(len(g[0]) for g in got) == 11 * 64
        assert st.stats()["rounds_loaded"] == 1  # the wrapped samples are in the one round
    with pytest.raises(ConfigError, match="circular"):
        Loader(ds, 64, preset="deepio-ordered", memory_fraction=0.25, **kw)


def _mpi(n, *args, timeout=300, nodes=0, shm=True):
    env = dict(os.environ, FEEDLINE_POLL_SLEEP_US="500", OMP_NUM_THREADS="1")
    env["FEEDLINE_STORE_SHARED_MEMORY"] = "1" if shm else "0"
    env.pop("FEEDLINE_NODES", None)
    if nodes:
        env["FEEDLINE_NODES"] = str(nodes)
    cmd = [
        mpiexec_command(),
        "-n",
        str(n),
        sys.executable,
        os.path.join(HERE, "mpi", "store_mpi.py"),
    ]
    proc = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc.stdout


@pytest.mark.parametrize(("n", "nodes"), [(2, 0), (4, 2)])
def test_store_under_mpiexec(cifar, n, nodes):
    # 4 ranks on 2 emulated nodes: samples of the other node come by MPI_Get
    out = _mpi(n, cifar, "check", nodes=nodes)
    assert out.count("STORE-OK") == n, out


@pytest.mark.parametrize(("n", "nodes"), [(2, 0), (4, 2)])
def test_progressive_store_regrows_the_same_on_every_rank(variable, n, nodes):
    """Switching seeds under mpiexec: a progressive store of uneven records (its slots
    sized for one seed's rounds) regrows at the same pass on every rank when another
    seed's rounds need more, and still delivers what reading for itself does."""
    out = _mpi(n, variable, "seeds", nodes=nodes)
    assert out.count("STORE-SEEDS-OK") == n, out
    assert all(int(line.split()[3]) >= 2 for line in out.splitlines() if "SEEDS-OK" in line)


@pytest.fixture(scope="module")
def variable(tmp_path_factory):
    # JPEG-encoded Datums: every record has its own length
    return generate(
        "cifar10-large",
        str(tmp_path_factory.mktemp("st") / "v"),
        samples=500,
        progress=False,
        encoded=True,
    )


@pytest.mark.parametrize(
    ("n", "nodes", "kind"),
    [
        *(
            (n, nodes, kind)
            for n, nodes in [(1, 0), (2, 0), (4, 2)]
            for kind in ("fixed", "variable")
        ),
        # 8 ranks on 4 emulated nodes: variable lengths in the default tier (the harder
        # placement), fixed ones in the full tier (11 s each on 2 cores)
        pytest.param(8, 4, "fixed", marks=pytest.mark.full),
        (8, 4, "variable"),
    ],
)
def test_both_modes_exactly_once_and_resume_exact(cifar, variable, kind, n, nodes):
    out = _mpi(n, cifar if kind == "fixed" else variable, "exact", nodes=nodes, timeout=600)
    assert out.count("STORE-EXACT-OK") == n, out


@pytest.mark.parametrize("kind", ["fixed", "variable"])
def test_exact_with_every_get_an_mpi_rget(cifar, variable, kind):
    # FEEDLINE_STORE_SHARED_MEMORY=0: no direct reads of the peers' shared memory, every
    # get from another rank is an MPI_Rget with indexed datatypes (the path across hosts)
    data = cifar if kind == "fixed" else variable
    out = _mpi(4, data, "exact", nodes=2, timeout=600, shm=False)
    assert out.count("STORE-EXACT-OK") == 4, out


@pytest.mark.parametrize(("n", "nodes", "then"), [(4, 2, 2), (2, 0, 3)])
def test_feedline_chooses_the_store_and_resumes_it_elsewhere(cifar, tmp_path, n, nodes, then):
    """Loader(path) under mpiexec: the cost model picks the store (store="auto"); a
    mid-epoch state resumes at another world size with the same remaining batches."""
    state = str(tmp_path / "state.json")
    out = _mpi(n, cifar, "auto", state, nodes=nodes)
    assert out.count("STORE-AUTO-OK") == n, out
    out = _mpi(then, cifar, "auto-resume", state)
    assert out.count("STORE-AUTO-RESUME-OK") == then, out


@pytest.mark.parametrize(
    "mode", ["slow-peers", "late-close", "out-of-step", "interrupted", "all-leave"]
)
def test_store_ranks_out_of_sync(cifar, mode):
    # slow-peers: a rank that left waits in close() while the others take their time
    # (no give-up on a timer); late-close: a rank closing after the grace period makes
    # every rank keep the window, nobody hangs; out-of-step: ranks in different epochs
    # raise StoreOutOfStepError together; interrupted: Ctrl-C in close() makes the others
    # raise StorePeerLeft at their next round; all-leave: every rank leaves a progressive
    # pass (no C1) and the rest is abandoned at the next C2, not loaded
    out = _mpi(3, cifar, mode, timeout=120)
    assert out.count(f"STORE-{mode.upper()}-OK") == 3, out


@pytest.mark.parametrize("how", ["rounds", "progressive"])
def test_store_load_error_reaches_every_rank(tmp_path, how):
    # R = 0.5, or R = 1 loaded progressively (the failed share read ahead of its C2)
    bad = generate("cifar10-bin", str(tmp_path / "b"), samples=200, progress=False)
    extra = ["progressive"] if how == "progressive" else []
    out = _mpi(3, bad, "error", *extra, timeout=120)
    assert out.count("STORE-ERROR-OK") == 3, out
    assert " own" in out and " peer: " in out  # the loader's typed error, and its peers'


@pytest.mark.parametrize(
    ("preset", "knobs", "B"),
    [
        ("deepio-opportunistic", {"memory_fraction": 1.0}, 64),
        ("deepio-opportunistic", {"memory_fraction": 0.3}, 64),
        # progressive: a fresh Loader resumed anywhere in epoch 0 loads the rounds the
        # steps left need (with circular=True the last step wraps to round 0)
        ("deepio-ordered", {"load_rounds": 4, "chunk": 16}, 32),
        ("deepio-ordered", {"load_rounds": 4, "chunk": 16, "circular": True}, 32),
    ],
)
def test_store_resume_at_every_step_is_bit_exact(cifar, preset, knobs, B):
    ds = open_dataset(cifar)
    kw = {"seed": 2, "decode": False, **knobs}
    with Loader(ds, B, preset=preset, **kw) as ld:
        full = _epoch(ld)
    for k in range(1, len(full) + 1):
        with Loader(ds, B, preset=preset, **kw) as ld:
            it = iter(ld)
            for _ in range(k):
                next(it)
            state = ld.state_dict()
        with Loader(ds, B, preset=preset, **kw) as again:
            again.load_state_dict(state)
            assert _same(_epoch(again), full[k:]), k


@pytest.mark.parametrize(
    ("n", "R", "B"), [(10_000, 0.25, 128), (1_000, 0.1, 7), (64 * 11 + 5, 0.3, 50)]
)
def test_round_ids_are_the_rounds_positions(n, R, B):
    # the store lists a round's ids from its units; they are the ids at its positions
    from feedline.plan import FlatRecords, WorldSpec, get_strategy, make_plan
    from feedline.sources.store import _Rounds

    strat = get_strategy("deepio-ordered", memory_fraction=R)
    plan = make_plan(FlatRecords(n, 100), WorldSpec(3, 1), strat, 4, 1, B)
    rounds = _Rounds(plan)
    assert rounds.count > 1
    seen = []
    for r in range(rounds.count):
        want = np.sort(plan.ids_at(np.arange(rounds.lo[r], rounds.hi[r])))
        assert np.array_equal(rounds.ids(r), want)
        seen.append(want)
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(n))


@pytest.mark.parametrize(
    ("preset", "R", "victim", "nodes"),
    [
        ("deepio-ordered", 0.25, 1, 2),
        ("deepio-opportunistic", 1.0, 0, 0),
        ("deepio-ordered", 1.0, 2, 2),
        ("deepio-ordered", "1.0/3", 3, 2),  # progressive, killed mid-load in epoch 0
    ],
)
def test_killed_rank_never_hangs_its_peers(cifar, tmp_path, preset, R, victim, nodes):
    # issue 16 item 3: SIGKILL of one of 4 ranks mid-epoch, the launcher's auto-cleanup
    # off: every survivor raises StorePeerDied (its peer watch sees the process gone) and
    # the exit hook aborts the job, or the MPI runtime ends it; never a hang, never a
    # survivor that goes on as if nothing happened
    import time

    hydra = os.path.join(os.path.dirname(mpiexec_command()), "mpiexec.hydra")
    if not os.access(hydra, os.X_OK):
        pytest.skip("needs MPICH's mpiexec.hydra (-disable-auto-cleanup)")
    env = dict(os.environ, FEEDLINE_POLL_SLEEP_US="500", OMP_NUM_THREADS="1")
    env["FEEDLINE_NODES"] = str(nodes)
    script = os.path.join(HERE, "mpi", "store_kill.py")
    cmd = [hydra, "-disable-auto-cleanup", "-n", "4", sys.executable, script]
    t0 = time.monotonic()
    proc = subprocess.run(
        [*cmd, cifar, preset, str(R), str(victim), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    took = time.monotonic() - t0
    assert took < 60, took
    assert proc.returncode != 0
    # (".*.tmp": a survivor aborted by another's exit while writing its file)
    files = sorted(f for f in os.listdir(tmp_path) if not f.startswith("."))
    assert not [f for f in files if f.startswith("finished")], files
    for f in files:  # survivors that raised name the dead rank
        text = (tmp_path / f).read_text()
        assert f"rank {victim} (pid" in text and "died" in text, text


def test_store_knob_picks_the_source_and_retired_knobs_say_why(cifar):
    from feedline.plan import Strategy, get_strategy

    ds = open_dataset(cifar)
    kw = {"seed": 3, "decode": False}
    with Loader(ds, 64, preset="deepio-ordered", store="off", **kw) as off:
        assert off.stats()["source"] == "direct"
        want = _epoch(off)
    with Loader(ds, 64, preset="global", assignment="memory", store="ordered", **kw) as on:
        assert on.stats()["source"] == "store"
        assert _same(_epoch(on), want)
    with pytest.raises(ConfigError, match=r"io_thread.*prefetch_depth"):
        get_strategy("async", io_thread=False)
    with pytest.raises(ConfigError, match="own_lock"):
        Loader(ds, 64, preset="skip", own_lock=False)
    old = dict(get_strategy("async").to_dict(), io_thread=True, own_lock=False)
    assert Strategy.from_dict(old) == get_strategy("async")  # older saved states load


def test_store_auto_semantics_and_resume_across_choices(cifar):
    """``store="auto"`` (the feedline preset): the store when the model says so, never
    when it is off, another source or window knobs are asked for, or it does not fit;
    a checkpoint made under one choice finishes its epoch under the other."""
    ds = open_dataset(cifar)
    kw = {"seed": 9, "decode": False}
    with Loader(ds, 32, **kw) as auto:
        s = auto.stats()
        assert s["source"] == "store" and s["plan_store"] == "chosen"
        assert s["plan_figures"]["later_epoch_s"] < s["plan_figures"]["first_epoch_s"]
        assert auto.strategy.assignment == "memory" and auto.strategy.store == "ordered"
        assert auto.strategy.read == "odirect"  # what the store keeps is not cached twice
        got = _epoch(auto)
        ids = np.concatenate([g[0] for g in got])
        assert np.array_equal(np.sort(ids), np.arange(len(ds)))
    with Loader(ds, 32, preset="deepio-ordered", **kw) as deepio:  # the same batches
        assert deepio.strategy.read == "pread"  # the paper's preset reads as it did
        assert _same(got, _epoch(deepio))
    with Loader(ds, 32, read="pread", **kw) as asked:  # a read= the user gave wins
        assert asked.stats()["source"] == "store" and asked.strategy.read == "pread"
    for extra, why in (
        ({"store": "off"}, "store='off'"),
        ({"source": "direct"}, "source='direct' asked for"),
        ({"chunk_bytes": 1 << 20}, "window knobs given (chunk_bytes)"),
    ):
        with Loader(ds, 32, **kw, **extra) as ld:
            s = ld.stats()
            assert s["source"] == "direct" and s["plan_store"] == f"off: {why}", extra
            assert ld.strategy.assignment == "window"
            assert f"DeepIO store: not a candidate ({why})" in ld.explain()
    small = "2MB"  # the store (2.9 MB with LMDB's holes) does not fit: windows
    with Loader(ds, 32, memory_cap=small, **kw) as win:
        assert win.stats()["source"] == "direct" and win.stats()["plan_store"] == "lost"
        assert "DeepIO store, R=1: rejected (memory cap" in win.explain()
        assert "DeepIO store, R=0.25: rejected (memory cap" in win.explain()
    with Loader(ds, 32, source="store", **kw) as forced:  # asked for: the store it is
        assert forced.stats()["source"] == "store"
    with pytest.raises(ConfigError, match="memory cap"):
        Loader(ds, 32, source="store", memory_cap=small, **kw)
    # a checkpoint under one choice, resumed under the other: the same rest of the epoch
    for first, then in (({"memory_cap": small}, {}), ({}, {"memory_cap": small})):
        with Loader(ds, 32, **kw, **first) as a:
            a.set_epoch(1)
            it = iter(a)
            for _ in range(5):
                next(it)
            state = a.state_dict()
            rest = [(b.ids.copy(), np.ascontiguousarray(b.data).copy()) for b in it]
        with Loader(ds, 32, **kw, **then) as b:
            assert b.stats()["source"] != a.stats()["source"]
            b.load_state_dict(state)
            assert _same(_epoch(b), rest)
            b.set_epoch(2)  # then its own choice
            ids = np.concatenate([x.ids for x in b])
            assert np.array_equal(np.sort(ids), np.arange(len(ds)))


def test_epochs_tells_the_cost_model_how_long_the_store_has_to_pay(cifar):
    """``epochs=`` (the epochs the job means to read) is the horizon the store's load is
    weighed over: unknown, 3 epochs; told 1, the store's first epoch against a window
    plan's; a bad value is a ConfigError."""
    ds = open_dataset(cifar)
    kw = {"seed": 9, "decode": False}
    with Loader(ds, 32, **kw) as auto:
        assert auto.choice.best.figures["horizon"] == 3
    for e in (1, 2, 50):
        with Loader(ds, 32, epochs=e, **kw) as ld:
            cands = [c for c in ld.choice.candidates if not c.rejected]
            store = [c for c in cands if c.unit == "store"]
            assert store and all(c.figures["horizon"] == e for c in store)
            f = store[0].figures
            assert store[0].cost == pytest.approx(
                (f["first_epoch_s"] + (e - 1) * f["later_epoch_s"]) / e, rel=1e-9
            )
            best_win = min(c.cost for c in cands if c.unit != "store")
            wins = min(c.cost for c in store) < best_win
            assert ld.stats()["source"] == ("store" if wins else "direct"), e
            ids = np.concatenate([b.ids for b in ld])
            assert np.array_equal(np.sort(ids), np.arange(len(ds)))
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(ConfigError, match="epochs must be an int >= 1"):
            Loader(ds, 32, epochs=bad, **kw)


def test_epochs_at_the_benchmarks_scale():
    """8 ranks on 4 emulated nodes, 200,000 LMDB records of 3 KB (``feedline bench
    lmdbio``'s job through ``feedline emulate``): a job of one epoch reads windows, a
    job of unknown length or of 3 epochs takes the store, which loads in its first."""
    from feedline.plan.cost import StorageProfile, choose
    from feedline.plan.lmdb_model import LmdbModel
    from feedline.plan.world import WorldSpec

    emu = StorageProfile("emulator", 3e-4, 0.8e9, 1e9, 2e9, 16, 16, contention="queue")
    args = (LmdbModel(200_000, 3072), WorldSpec(8, 4), 2048, int(2.5e9), emu)
    once = choose(*args, epochs=1)
    assert once.best.unit != "store" and once.strategy.assignment == "window"
    for e in (None, 3):
        c = choose(*args, epochs=e)
        assert c.best.unit == "store" and c.best.figures["horizon"] == 3
        assert "over 3 epochs" in c.explain()


@pytest.mark.parametrize("preset", ["deepio-ordered", "deepio-opportunistic"])
def test_progressive_first_epoch_waits_for_one_round_and_keeps_them_all(cifar, preset):
    """load_rounds=4 at R = 1: epoch 0 is memory(1/4)'s order (its first rounds ramped
    up: smaller), its first batch waits for the first round only, the other rounds load
    while it is served and stay in memory; later epochs are full permutations that read
    nothing."""
    from feedline.plan.rl import ramp_floor, rl_memory

    ds = open_dataset(cifar)
    kw = {"load_rounds": 4, "chunk": 4, "seed": 5, "decode": False}
    with (
        Loader(ds, 32, preset=preset, **kw) as st,
        Loader(ds, 32, preset=preset, source="direct", **kw) as ref,
    ):
        it = iter(st)
        first = next(it)
        rounds = st._source._rounds  # the first batch needs the first round only
        # 175 units of 4: rounds of 16, 17, 18, 19, 20, 22, 24, 26, then 13 units
        assert rounds.count == 9 and rounds.step_max[0] == 0 and rounds.slots == 9
        sizes = rounds.hi - rounds.lo
        assert sizes[0] < sizes[1] < min(sizes[2], sizes[3])  # a unit may be short
        held = np.diff(st._source._slot_at)  # each round's slot of its own size
        assert held[0] < held[1] < held[2] and st.stats()["store_bytes"] == held.sum()
        assert 1 <= st.stats()["rounds_loaded"] <= 9  # later rounds complete as they land
        got = [(first.ids.copy(), np.ascontiguousarray(first.data).copy())]
        got += [(b.ids.copy(), np.ascontiguousarray(b.data).copy()) for b in it]
        assert _same(got, _epoch(ref))
        assert np.array_equal(np.sort(np.concatenate([g[0] for g in got])), np.arange(len(ds)))
        s = st.stats()
        assert s["rounds_loaded"] == 9 and s["storage_bytes"] > 0
        loaded = s["storage_bytes"]
        assert s["rl"] == pytest.approx(rl_memory(len(ds), 0.25, unit=4, ramp=ramp_floor(32, 4)))
        assert s["rl"] < 1
        for e in (1, 2):
            st.set_epoch(e)
            ref.set_epoch(e)
            assert _same(_epoch(st), _epoch(ref))
        assert st.stats()["storage_bytes"] == loaded  # from memory
        assert st.stats()["rounds_loaded"] == 9
        assert st.stats()["rl"] == pytest.approx(1.0)
    # a resume mid-epoch 0: test_store_resume_at_every_step_is_bit_exact


def test_progressive_load_keeps_pace_with_the_consumer(cifar):
    """A progressive store reads at most READ_AHEAD rounds past the one the consumer's
    steps need (a load running as fast as the disk allows took the CPU from the
    epoch's first steps); the rest loads as the consumer advances, and the epoch is
    still exact."""
    import time

    from feedline.sources.store import READ_AHEAD

    ds = open_dataset(cifar)
    kw = {"load_rounds": 6, "chunk": 16, "seed": 5, "decode": False}
    with (
        Loader(ds, 16, preset="deepio-ordered", **kw) as st,
        Loader(ds, 16, preset="deepio-ordered", source="direct", **kw) as ref,
    ):
        it = iter(st)
        got = [next(it)]
        src = st._source
        count = src._rounds.count  # about 6 (whole units of 16)
        assert count >= 5 and int(src._rounds.step_max[3]) == 0
        time.sleep(0.3)  # the producer is 2 steps ahead, still in round 0
        assert src._ahead_hi <= READ_AHEAD < src._rounds.last
        assert st.stats()["rounds_loaded"] <= 1 + READ_AHEAD
        got += list(it)
        assert st.stats()["rounds_loaded"] == count
        want = _epoch(ref)
        assert _same([(b.ids, np.ascontiguousarray(b.data)) for b in got], want)


def test_progressive_rounds_needing_c1_begin_only_when_a_step_needs_them(cifar):
    """After a seed switch a progressive store's slots hold the other seed's rounds:
    freeing one takes C1, a blocking collective. It must come at the step that needs
    the round, the same on every rank, never early at a step set by when this rank saw
    a C2 complete (it could wait there for a peer blocked in the training loop's own
    collective, which waits for this rank's batch). The epoch is still exact."""
    import time

    ds = open_dataset(cifar)
    # units of 20: 700 records make 35 whole units, so every seed's rounds are of the
    # same sizes and fit the slots of seed 5 (no regrowing, which would free them all)
    kw = {"load_rounds": 6, "chunk": 20, "decode": False}
    with Loader(ds, 16, preset="deepio-ordered", seed=5, **kw) as a:
        _epoch(a)  # every slot holds a round of seed 5
        rma = a._source._rma
        with Loader(ds, 16, preset="deepio-ordered", seed=6, **kw) as b:
            state = b.state_dict()
        a.load_state_dict(state, strict=False)  # seed 6, epoch 0, from step 0
        it = iter(a)
        got = [next(it)]
        time.sleep(0.3)  # the producer runs 2 steps ahead, all in round 0
        src = a._source
        assert src._rma is rma  # not regrown: the slots still hold seed 5's rounds
        assert int(src._rounds.step_max[3]) == 0
        assert src._hi == 0 and src._next is None and not src._ahead  # nothing read early
        got += list(it)
        with Loader(ds, 16, preset="deepio-ordered", source="direct", seed=6, **kw) as ref:
            want = _epoch(ref)
        assert _same([(g.ids, np.ascontiguousarray(g.data)) for g in got], want)


def test_progressive_store_switching_seeds_serves_the_right_bytes(cifar):
    """Rounds of another seed's layout are kept in memory, but their placement is
    forgotten once rounds of the new seed overwrite it: switching back re-places them."""
    ds = open_dataset(cifar)
    kw = {"load_rounds": 4, "chunk": 16, "decode": False}
    with Loader(ds, 32, preset="deepio-ordered", seed=5, **kw) as a:
        states = {}
        for seed in (5, 6):
            with Loader(ds, 32, preset="deepio-ordered", seed=seed, **kw) as other:
                it = iter(other)
                # seed 6 resumes in its last round (loads only that one); seed 5 at
                # step 1 (needs every round: the kept ones must be placed again)
                for _ in range(17 if seed == 6 else 1):
                    next(it)
                states[seed] = (other.state_dict(), [(b.ids.copy(), None) for b in it])
        full5 = _epoch(a)  # every round of seed 5 resident and placed
        for seed in (6, 5):
            a.load_state_dict(states[seed][0], strict=False)
            with Loader(ds, 32, preset="deepio-ordered", source="direct", seed=seed, **kw) as ref:
                ref.load_state_dict(states[seed][0], strict=False)
                assert _same(_epoch(a), _epoch(ref)), seed
        assert full5


@pytest.mark.parametrize("P", [1, 3, 7])
@pytest.mark.parametrize("gap", [0, 100, 5000])
@pytest.mark.parametrize("file_order", [True, False])
def test_place_shares_is_each_shares_own_coalesce(P, gap, file_order):
    """The store places a round's P shares at once (vectorised); every record lands
    where coalescing its share alone puts it, including shares read record by record
    because their merged reads would not fit the slot."""
    from feedline.pipeline.reader import coalesce
    from feedline.sources.store_plan import _share, place_shares

    rng = np.random.default_rng(P * 1000 + gap)
    n = 3000
    fid = np.sort(rng.integers(0, 2, n)).astype(np.int64)
    ln = rng.integers(1, 400, n).astype(np.int64)
    off = np.zeros(n, dtype=np.int64)
    for f in (0, 1):  # records of a file in order, with holes of 0-6,000 bytes
        m = fid == f
        holes = rng.integers(0, 6000, int(m.sum()))
        off[m] = np.cumsum(ln[m] + holes) - ln[m]
    if not file_order:  # ids not in file order (an LMDB's keys vs its pages)
        perm = rng.permutation(n)
        fid, off, ln = fid[perm], off[perm], ln[perm]
    ids = np.sort(rng.choice(n, 1800, replace=False)).astype(np.int64)
    payload = [int(ln[_share(ids, P, k)].sum()) for k in range(P)]
    slot = int(np.median(payload) * 1.5) + 1  # some shares fit with holes, some do not
    owner, src = place_shares(fid, off, ln, ids, P, gap, slot)
    fallback = 0
    for k in range(P):
        part = _share(ids, P, k)
        c = coalesce(fid[part], off[part], ln[part], gap=gap)
        if c.reads.nbytes > slot:
            c = coalesce(fid[part], off[part], ln[part], gap=0)
            fallback += 1
        sel = np.searchsorted(ids, part)
        assert (owner[sel] == k).all()
        assert np.array_equal(src[sel], c.src), (k, gap)
    if gap == 5000:
        assert fallback > 0  # the record-by-record path was exercised


def test_store_memory_counts_the_bounce_buffers_of_its_direct_loads(cifar):
    """A share's merged reads start at records' offsets, which ``O_DIRECT`` reads through
    each engine thread's bounce buffer: the store's estimate counts them (they once ran a
    1-process store 3% over the cap it accepted: tests/test_memory_sweep.py), and the
    chooser's exact check (``store_overflow``) counts them before the store is taken."""
    from feedline.pipeline.reader import BOUNCE_BYTES
    from feedline.sources.store_plan import store_overflow

    est = {}
    for read in ("odirect", "pread"):
        with Loader(cifar, 70, preset="deepio-ordered", read=read, io_threads=3) as ld:
            est[read] = ld.memory_estimate()["source"]
    assert est["odirect"] - est["pread"] == 3 * BOUNCE_BYTES
    with Loader(cifar, 70, source="store") as ld:
        args = (ld._records, ld.world.spec, 70, ld.memory_estimate()["source"], None)
        # its own estimate fits; the same less one bounce buffer does not
        assert store_overflow(ld._index, ld.strategy, args, ld.seed) == ""
        short = (*args[:3], args[3] - BOUNCE_BYTES, None)
        assert "slots and read buffers" in store_overflow(ld._index, ld.strategy, short, ld.seed)
