# SPDX-License-Identifier: Apache-2.0
"""The DeepIO store as a candidate of the cost model (``store="auto"``; docs/deepio.md).

:func:`store_estimate` gives, in the same closed form and the same
:class:`~feedline.plan.cost.Estimate` as :func:`~feedline.plan.cost.estimate` gives a
``window`` candidate, one epoch of the ``deepio-*`` presets: the job's memory holds the
dataset (R = 1) or rounds of a fraction R of it (2R held: double buffering); each rank
loads its share of a round from storage in a few long reads, and builds its sub-batches
by copies from its own memory and its node's, and by batched one-sided gets (one per
remote rank and step) from other nodes. With R = 1 only the first epoch reads storage.

Terms (seconds per epoch, the keys of ``Estimate.terms``): ``first_window`` (the first
round's load, exposed before the first batch: with R = 1 the whole load; in the first
epoch also the first touch of the store's memory), ``latency`` and
``transfer`` of the other rounds' loads (overlapped with serving the rounds before them;
zero when R = 1), ``serve`` (remote gets and the bytes they bring), ``coordination``
(two collectives per round) and ``cpu`` (the ranks' delivery, every record's copy
included, as for a window plan: :func:`~feedline.plan.cost.cpu_s`); with R = 1 the
epochs after the first read nothing. Each load is
counted once. Pure: no I/O, no MPI.

:func:`store_candidate` is what :func:`~feedline.plan.cost.choose` compares with the
``window`` candidates (``store="auto"``): the store's mean cost per epoch over the first
:data:`EPOCH_HORIZON` epochs (it pays its load in the first; with R = 1 the later ones
only serve from memory), while a ``window`` candidate costs the same every epoch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..units import format_bytes
from .cost import (
    ENGINE_CHUNK,
    READER_DEPTH,
    Estimate,
    Shape,
    StorageProfile,
    contention_factor,
    cpu_s,
    server_busy_s,
)
from .rl import memory_unit, ramp_floor, rl_memory, round_cuts

#: holes a store's load reads through when the strategy's ``coalesce_gap`` is 0: two
#: pages, so LMDB's page headers, the tails of overflow pages and the leaf pages between
#: them do not cut a share into one read per record
STORE_GAP = 8192
#: epochs over which the store's first-epoch load is weighed against what it saves
#: later: it must pay for itself within this many epochs to be chosen
EPOCH_HORIZON = 3
#: memory fractions the chooser tries, largest first (R = 0.5 holds 2R = everything,
#: like R = 1, so it is never the one that fits when R = 1 does not)
FRACTIONS = (1.0, 0.25)


@dataclass(frozen=True)
class Fabric:
    """What the store's remote gets cost (per node: bytes/s; per get: seconds).

    The default is this machine's emulated nodes (every "remote" get is an MPICH
    ``MPI_Rget`` through shared memory, measured by ``feedline bench deepio``); an
    InfiniBand fabric has ~2-5 µs per get and 10-25 GB/s per node.
    """

    get_latency_s: float = 2e-5
    node_bw: float = 5e9
    collective_s: float = 1e-4  # one small allgather of the store's, per log2(P)
    #: first touch of the store's fresh memory (page faults and zeroing of the window),
    #: per rank, paid once by the Loader's first epoch: 0.35-3 GB/s here
    #: (``Win.Allocate`` of 52 MB per rank, 4 ranks on 2 busy cores)
    touch_bw: float = 1e9


FABRIC = Fabric()


#: a progressive first epoch (``load_rounds``, R = 1) loads in at most this many full
#: rounds (K); its first rounds ramp up (``rl.round_cuts``), so it has a few more
MAX_LOAD_ROUNDS = 16
#: units a full progressive round holds at least: a batch drawn from it sees units from
#: all over the dataset (a class-sorted dataset's batches still see ~every class); the
#: ramp's first rounds hold at least ``rl.RAMP_MIN_UNITS`` and the first batch
MIN_ROUND_UNITS = 32
#: bytes a rank loads per progressive round at least (its reads stay long)
MIN_ROUND_BYTES = 2 << 20
#: bytes of a unit of a progressive load: its reads are of a unit or more
LOAD_UNIT_BYTES = 512 << 10
#: units of LOAD_UNIT_BYTES a dataset must make for a progressive load: with fewer, the
#: rounds' order would correlate with the disk order (about 1/sqrt(units)), and smaller
#: units would cost requests; such a dataset loads at once (it is small)
MIN_LOAD_UNITS = 512


def load_rounds_for(sh: Shape, rl_floor: float) -> tuple[int, int]:
    """``(load_rounds, unit samples)`` of the store at R = 1: the first epoch loads in K
    rounds of random units of about :data:`LOAD_UNIT_BYTES`, so that its first batch
    waits for 1/K of the load, not all of it. Its order is ``memory(1/K)``'s, whose RL
    must reach *rl_floor*. ``(0, 0)``: one load (fewer than :data:`MIN_LOAD_UNITS`
    units: too small to cut)."""
    g = max(1, math.ceil(LOAD_UNIT_BYTES / max(sh.mean_len, 1.0)))
    units = math.ceil(sh.n / g) if sh.n else 0
    if units < MIN_LOAD_UNITS:
        return (0, 0)
    per_rank = sh.n * sh.mean_len / max(sh.ranks, 1)
    K = min(MAX_LOAD_ROUNDS, units // MIN_ROUND_UNITS, int(per_rank // MIN_ROUND_BYTES))
    ramp = ramp_floor(sh.batch, g)
    while K > 1 and rl_memory(sh.n, 1.0 / K, unit=g, ramp=ramp) + 1e-12 < rl_floor:
        K -= 1
    return (K, g) if K > 1 else (0, 0)


def store_bounce_per_node(sh: Shape) -> int:
    """The store readers' ``O_DIRECT`` bounce buffers on a node: :data:`READER_DEPTH`
    engine threads a rank, each with one (a share's merged reads start at records'
    offsets, not at block boundaries)."""
    from ..io.engine import BOUNCE_BYTES

    return -(-max(sh.ranks, 1) // max(sh.nodes, 1)) * READER_DEPTH * BOUNCE_BYTES


def store_slots_per_node(sh: Shape, memory_fraction: float, load_rounds: int = 0) -> float:
    """Bytes of store per node: R of the dataset (2R when R < 1: a round of whole
    units, + 2%; R = 1 loaded progressively: every round's slot, + 2%), over the nodes,
    with the holes its loads read through (``sh.span``: LMDB's page headers and tails).
    Its memory is this and its readers' bounce buffers (:func:`store_bounce_per_node`)."""
    if memory_fraction >= 1.0:
        held = 1.02 if load_rounds > 1 else 1.0
    else:  # two slots of whole units, each grown 2% for holes (sources/store_plan.py)
        units = max(1, math.ceil(sh.n / memory_unit(sh.n, memory_fraction)))
        held = 2.0 * max(1, round(memory_fraction * units)) / units * 1.02
    return sh.n * sh.mean_len * sh.span * held / max(sh.nodes, 1)


def store_estimate(
    sh: Shape,
    profile: StorageProfile,
    memory_fraction: float = 1.0,
    *,
    mode: str = "ordered",
    epoch: int = 1,
    fabric: Fabric = FABRIC,
    rl_floor: float = 0.9,
) -> Estimate:
    """The model's figures for the store at fraction R, for epoch *epoch* (0: the first,
    which loads R = 1; from 1 on R = 1 reads nothing). *mode*: ``ordered`` or
    ``opportunistic`` (its sub-batches come from the rank's own memory: no gets).
    At R = 1 the first epoch loads progressively when it is large enough
    (:func:`load_rounds_for`, with *rl_floor*): its first batch waits for one round.
    Rejected (``Estimate.rejected``) when the store does not fit the memory cap."""
    R = float(memory_fraction)
    P, M, B = max(sh.ranks, 1), max(sh.nodes, 1), max(sh.batch, 1)
    payload = sh.n * sh.mean_len
    K, g = load_rounds_for(sh, rl_floor) if R >= 1.0 else (0, 0)
    est = Estimate("store", 0, 0, 0, {"store": mode, "memory_fraction": R})
    slots = store_slots_per_node(sh, R, K)  # what it holds and touches
    est.memory_per_node = slots + store_bounce_per_node(sh)
    est.window_bytes = int(slots * M / P)
    if est.memory_per_node > sh.cap:
        est.rejected = (
            f"memory cap: the store needs {format_bytes(est.memory_per_node)} per node at "
            f"R={R:g}, over the {format_bytes(sh.cap)} left of the cap for reading"
        )
        return est
    unit = g or memory_unit(sh.n, R)
    units = max(1, math.ceil(sh.n / unit))
    per_round = max(1, round((1.0 / K if K else R) * units))
    # a progressive load's rounds ramp up from one that holds the first batch (round_cuts)
    ramp = ramp_floor(B, g) if K > 1 else 0
    cuts = round_cuts(units, per_round, ramp)
    rounds = len(cuts) - 1
    first_share = float(cuts[1] - cuts[0]) / units if rounds > 1 else 1.0
    loads = not (R >= 1.0 and epoch >= 1)
    # loads: each rank reads its share of every round; a round's share is a run of its
    # sorted units (adjacent ones merge): about one read per unit in rounds (R < 1, or
    # R = 1 progressively), a few engine-sized requests when R = 1 loads at once
    disk = payload * sh.span
    reqs = (units if rounds > 1 else P) + disk / ENGINE_CHUNK if loads else 0.0
    ranks_on_node = -(-P // M)
    streams = P * READER_DEPTH
    f = contention_factor(profile, streams)
    per_rank_bw = min(
        profile.stream_bw * min(READER_DEPTH, max(profile.streams_per_node, 1)),
        profile.node_bw / ranks_on_node,
    )
    lat = profile.latency_s * f
    t_lat = reqs * lat / (READER_DEPTH * P) if loads else 0.0
    t_bw = disk / P / per_rank_bw if loads else 0.0
    t_agg = disk * f / profile.aggregate_bw if loads and profile.aggregate_bw else 0.0
    t_agg = max(t_agg, server_busy_s(profile, reqs, disk) if loads else 0.0)
    # the first round's load is exposed (nothing is served before it is in); the
    # others overlap the rounds served before them: each load is counted once
    first = (t_lat + max(t_bw, t_agg)) * first_share if loads else 0.0
    if epoch == 0:  # the window's memory is touched once, by the first loads
        first += slots * M / P / fabric.touch_bw
    t_lat, t_bw, t_agg = (x * (1.0 - first_share) for x in (t_lat, t_bw, t_agg))
    # serving: of a rank's sub-batch, 1/P is its own memory, (ranks_on_node - 1)/P its
    # node's, the rest on other nodes (ordered); opportunistic serves its own memory
    steps = max(sh.steps, 1)
    remote_frac = 0.0 if mode == "opportunistic" else (P - ranks_on_node) / P
    remote = payload * remote_frac
    gets = 0.0 if mode == "opportunistic" else steps * P * min(P - ranks_on_node, B / P)
    # the copy of every record into its batch is the ``cpu`` term's, as for a window plan
    t_serve = remote / (fabric.node_bw * M) + gets / P * fabric.get_latency_s
    est.requests = reqs
    est.bytes = disk if loads else 0.0
    est.readers = P
    est.windows_per_unit = rounds
    est.regions_per_batch = float(B)
    est.terms = {
        "latency": t_lat,
        "transfer": max(t_bw, t_agg),
        "first_window": first,
        "serve": t_serve,
        "coordination": (2 * rounds if loads else 0) * fabric.collective_s * max(1.0, math.log2(P)),
        "cpu": cpu_s(sh, profile, disk if loads else 0.0),
    }
    est.knobs = {
        "assignment": "memory",
        "store": mode,
        "memory_fraction": R,
        "load_rounds": K,
        "region": "rank",
        "readers_per_node": 0,
        "chunk": g,
        "chunk_bytes": 0,
        "window_bytes": 0,
        "window_steps": 0,
        "coalesce_bytes": 0,
        "coalesce_gap": 0,
    }
    # the first epoch's RL (a progressive load's is memory(1/K)'s; later ones are 1)
    est.rl = rl_memory(
        sh.n,
        1.0 / K if K else R,
        unit=min(unit, max(sh.n, 1)),
        ranks=P if mode == "opportunistic" else 1,
        ramp=ramp,
    )
    est.figures = {"remote_gets": gets, "remote_bytes": remote, "load_rounds": K}
    return est


def store_candidate(
    sh: Shape,
    profile: StorageProfile,
    memory_fraction: float = 1.0,
    *,
    mode: str = "ordered",
    horizon: int = EPOCH_HORIZON,
    fabric: Fabric = FABRIC,
    rl_floor: float = 0.9,
) -> Estimate:
    """The store as a candidate of :func:`~feedline.plan.cost.choose`: each term the
    mean over the first *horizon* epochs (the first loads; with R = 1 the later ones
    read nothing), so that ``cost`` compares with a ``window`` candidate's cost per
    epoch. ``requests`` and ``bytes`` are the first epoch's (the load); ``figures``
    keeps the first and the later epochs' costs (``first_epoch_s``,
    ``later_epoch_s``) and the remote gets and bytes per epoch."""

    def one(epoch: int) -> Estimate:
        return store_estimate(
            sh, profile, memory_fraction, mode=mode, epoch=epoch, fabric=fabric, rl_floor=rl_floor
        )

    est = one(0)
    if est.rejected:
        return est
    later = one(1)
    H = max(1, int(horizon))
    est.figures.update(first_epoch_s=est.cost, later_epoch_s=later.cost, horizon=H)
    est.terms = {k: (v + (H - 1) * later.terms[k]) / H for k, v in est.terms.items()}
    # requests and bytes stay the first epoch's: the load, the store's busiest epoch
    return est
