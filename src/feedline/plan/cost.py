# SPDX-License-Identifier: Apache-2.0
"""The cost model and the chooser behind the ``feedline`` preset (docs/planner.md, "Cost model").

``choose(records, world, batch_size, memory_cap, profile)`` estimates, for every
candidate plan of the ``window`` assignment (who reads: every rank or one reader per
node; tile size; window size), the epoch's time on the given storage profile —
requests x latency, bytes / bandwidth under the concurrency the plan creates, a
contention factor when the job's streams outnumber what the servers serve well, the
first window (exposed before the first batch), coordination per step and per window,
the ranks' own CPU against the host's cores (:func:`cpu_s`) —
plus its memory per node, randomization level and how many places of the file a global
batch draws from. The ``feedline`` preset is the cheapest candidate that fits the memory
cap, reaches the RL floor and mixes (>= ``MIX_REGIONS`` tiles per global batch, or every
tile of the dataset). With ``store="auto"`` the DeepIO store is a candidate too
(:func:`~feedline.plan.store_cost.store_candidate`: its mean cost over the first
``EPOCH_HORIZON`` epochs, when it fits the cap). Everything is closed-form in the job's
shape: choosing for 9,216 ranks takes milliseconds, and every rank computes the same
choice without talking.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ..errors import ConfigError
from ..units import format_bytes
from .assign_window import weighted_window_steps, window_sizes
from .profiles import (  # noqa: F401 - re-exported: the model's storage side
    FS_PROFILES,
    PROFILES,
    StorageProfile,
    fs_type,
    get_profile,
)
from .records import top_bytes
from .strategy import Strategy
from .world import WorldSpec

_KiB, _MiB = 1 << 10, 1 << 20

#: tiles per global batch below which a class-sorted dataset shows in the batches
MIX_REGIONS = 32
#: tiles in the file at least: the delivery order's rank correlation with the disk
#: order is that of a random order of the tiles, ~ 1/sqrt(tiles) (0.06 at 256)
MIN_TILES = 256
#: tile sizes tried (bytes)
TILE_BYTES = (256 * _KiB, 512 * _KiB, 1 * _MiB, 2 * _MiB, 4 * _MiB, 8 * _MiB, 16 * _MiB, 32 * _MiB)
#: tiles per window tried (0: as large as the memory cap allows)
WINDOW_TILES = (32, 64, 128, 0)
#: requests a reader keeps in flight (the native engine's threads per reader)
READER_DEPTH = 4
#: most engine threads of a node reader (:func:`reader_threads`)
NODE_READER_MAX_THREADS = 32


def reader_threads(io_threads: int, ranks: int, profile=None, readers: int = 1) -> int:
    """Engine threads of a reader that reads for *ranks* ranks: as many requests in
    flight as those ranks would keep reading for themselves (*io_threads* each), at most
    :data:`NODE_READER_MAX_THREADS` and never fewer than *io_threads*. On a ``collapse``
    *profile* (streams beyond ``server_streams`` cost bandwidth), the job's *readers*
    keep within ``server_streams`` together instead. A node reader with only its own
    rank's 4 threads read 794 MB at 84% of the per-rank path's speed on 1 node x 4 ranks
    here (local disk), with 16 at 88-94% (docs/planner.md)."""
    n = max(io_threads, min(io_threads * max(ranks, 1), NODE_READER_MAX_THREADS))
    if profile is not None and profile.contention == "collapse" and profile.server_streams:
        n = min(n, max(io_threads, int(profile.server_streams) // max(readers, 1)))
    return n


def node_reader_options(options, world, per_node: int, profile=None):
    """*options* (a Loader's ``PipelineOptions``) with the ``io_threads`` of a node
    reader: :func:`reader_threads` of the ranks it reads for, *per_node* readers on each
    node of *world* (``size`` ranks on ``nodes`` nodes)."""
    import dataclasses

    k, nodes = max(int(per_node or 1), 1), max(int(world.nodes), 1)
    per_node_ranks = -(-int(world.size) // nodes)
    ranks = -(-per_node_ranks // k)  # the ranks one reader reads for
    n = reader_threads(options.io_threads, ranks, profile, nodes * k)
    return dataclasses.replace(options, io_threads=n)


#: the engine splits longer extents into requests of this size (defaults.io_chunk_mib)
ENGINE_CHUNK = 8 * _MiB
#: the CPU a rank spends delivering an epoch, besides waiting for reads (the ``cpu``
#: term; measured on this 2-core VM, one process and 4 ranks: docs/planner.md, "The
#: host's CPU"): per step (the hand-over, the step's plan, the batch's objects) ...
CPU_STEP_S = 1e-4
#: ... per byte of the batches it assembles (one copy of every record out of its buffer)
CPU_COPY_BW = 2e9
#: ... and per record decoded (``decode=True``: a Caffe ``Datum``'s parse, a row's copy)
DECODE_RECORD_S = 1e-6
#: the share of a core's time a rank's work gets when more ranks than cores share a host
#: (switches between them, caches lost): 4 and 8 ranks on this VM's 2 cores
SHARED_CORE_EFFICIENCY = 0.65
#: coordination costs (seconds), calibrated on this machine (docs/planner.md)
COORD = {
    "rank": {"step": 5e-6, "window": 2e-4},
    "node": {"step": 3e-5, "window": 2e-3},
}


# ------------------------------------------------------------------ the model


@dataclass(frozen=True)
class Shape:
    """The job and dataset as the model sees them."""

    n: int
    mean_len: float
    max_len: int
    span: float  # bytes on disk per payload byte over runs of records (holes included)
    ranks: int
    nodes: int
    batch: int
    cap: int
    top: Any = field(default=None, compare=False, repr=False)  # records.top_bytes(records, .)
    #: ranks that share one host's cores, and those cores (0: a node's ranks, a core each)
    host_ranks: int = 0
    host_cores: int = 0
    #: CPU seconds per record besides its copy (decoding: :data:`DECODE_RECORD_S`)
    record_cpu_s: float = 0.0

    def top_bytes(self, k: int) -> int:
        """The most bytes of *k* records (without ``top``: k x the longest)."""
        return int(self.top(k)) if self.top is not None else int(k) * self.max_len

    @property
    def file_bytes(self) -> float:
        return self.n * self.mean_len * self.span

    @property
    def steps(self) -> int:
        return -(-self.n // self.batch) if self.n else 0


@dataclass
class Estimate:
    """One candidate's figures (seconds, bytes, counts) and the knobs that make it."""

    unit: str
    tile_bytes: int
    window_bytes: int
    window_steps: int
    knobs: dict[str, Any]
    requests: float = 0.0
    bytes: float = 0.0
    readers: int = 0
    windows_per_unit: int = 0
    tiles_per_window: float = 0.0
    regions_per_batch: float = 0.0
    memory_per_node: float = 0.0
    terms: dict[str, float] = field(default_factory=dict)
    rl: float | None = None
    rejected: str = ""
    figures: dict[str, float] = field(default_factory=dict)  # the store's (store_cost.py)

    @property
    def cost(self) -> float:
        return float(sum(self.terms.values()))

    @property
    def mean_read(self) -> float:
        return self.bytes / max(self.requests, 1.0)

    def label(self) -> str:
        if self.unit == "store":
            R = float(self.knobs.get("memory_fraction", 1.0))
            return (
                f"DeepIO store ({self.knobs.get('store', 'ordered')}, R={R:g}), whole-epoch shuffle"
            )
        who = "1 reader/node" if self.unit == "node" else "every rank"
        return f"{who}, tiles {_fmt(self.tile_bytes)}, windows {_fmt(self.window_bytes)} ({self.window_steps} steps)"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["cost"] = self.cost
        d["mean_read"] = self.mean_read
        return d


def _fmt(b: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", _MiB), ("KiB", _KiB)):
        if b >= size:
            return f"{b / size:.3g} {unit}"
    return f"{b:.0f} B"


def span_ratio(records) -> float:
    """Bytes of the file per payload byte when whole runs of records are read (>= 1)."""
    cached = getattr(records, "_span_ratio", None)
    if cached is not None:
        return cached
    import numpy as np

    from .records import CountOnly

    n = records.n
    if n == 0 or isinstance(records, CountOnly):
        return 1.0
    if hasattr(records, "file_ids") and hasattr(records, "offsets"):
        fid = np.asarray(records.file_ids)
        off = np.asarray(records.offsets, dtype=np.int64)
        ln = np.asarray(records.lengths, dtype=np.int64)
        end = off + ln
        if int(fid.min()) == int(fid.max()):  # one file (O(n), no sort)
            span = int(end.max() - off.min())
        else:  # per file: the first byte and the end of its records
            nf = int(fid.max()) + 1
            lo = np.full(nf, np.iinfo(np.int64).max, dtype=np.int64)
            hi = np.full(nf, -1, dtype=np.int64)
            np.minimum.at(lo, fid, off)
            np.maximum.at(hi, fid, end)
            used = hi >= 0
            span = int((hi[used] - lo[used]).sum())
        ratio = max(1.0, span / max(int(ln.sum()), 1))
    else:
        ids = np.array([0, n - 1])
        fid, off, ln = records.extents(ids)
        if fid[0] == fid[1]:
            ratio = max(
                1.0, (int(off[1] + ln[1]) - int(off[0])) / max(n * records.mean_length, 1.0)
            )
        else:  # pragma: no cover - multi-file synthetic layouts do not exist
            ratio = 1.0
    with contextlib.suppress(AttributeError, TypeError):  # frozen: recomputed (O(1) for them)
        records._span_ratio = ratio
    return ratio


def host_of(sh: Shape) -> tuple[int, int]:
    """``(ranks, cores)`` of the host the ``cpu`` term prices (default: a node's ranks,
    a core each)."""
    ranks = max(1, min(sh.host_ranks or -(-sh.ranks // max(sh.nodes, 1)), max(sh.ranks, 1)))
    return ranks, max(1, sh.host_cores or ranks)


def cpu_s(sh: Shape, profile: StorageProfile, read_bytes: float) -> float:
    """The ``cpu`` term: the seconds one host's cores take for what its ranks do in an
    epoch besides waiting (per step :data:`CPU_STEP_S`, the batches' copy at
    :data:`CPU_COPY_BW`, ``record_cpu_s`` per record), plus the storage's own CPU on the
    host (``profile.host_cpu_per_byte`` of the host's share of *read_bytes*, the bytes
    the job reads in the epoch). With a core per rank this is one rank's CPU (the
    storage's CPU may use spare cores); with more ranks than cores (a laptop, or this
    VM) the ranks take turns on the cores, which then do less work each: down to
    :data:`SHARED_CORE_EFFICIENCY` of it at twice as many ranks as cores."""
    P = max(sh.ranks, 1)
    ranks, cores = host_of(sh)
    per_rank = (
        max(sh.steps, 1) * CPU_STEP_S
        + sh.n * sh.mean_len / P / CPU_COPY_BW
        + sh.n / P * sh.record_cpu_s
    )
    host = ranks * per_rank + read_bytes * ranks / P * profile.host_cpu_per_byte
    # from 1 (a core each) down to SHARED_CORE_EFFICIENCY at twice as many ranks as cores
    over = min(1.0, max(0, ranks - cores) / max(cores, 1))
    eff = 1.0 - (1.0 - SHARED_CORE_EFFICIENCY) * over
    return max(per_rank, host / (max(cores, 1) * eff))


def shape_of(
    records,
    world: WorldSpec,
    batch_size: int,
    memory_cap: int,
    host: tuple[int, int] | None = None,
    record_cpu_s: float = 0.0,
) -> Shape:
    """The model's view of the job; *host* is ``(ranks, cores)`` of one host (None: a
    node's ranks, each with its core)."""
    hr, hc = host or (0, 0)
    return Shape(
        n=int(records.n),
        mean_len=float(records.mean_length) or 1.0,
        max_len=int(records.max_length) or 1,
        span=span_ratio(records) * 1.02,  # tile boundaries and merged holes
        ranks=world.size,
        nodes=world.nodes,
        batch=int(batch_size),
        cap=int(memory_cap),
        top=partial(top_bytes, records),
        host_ranks=int(hr),
        host_cores=int(hc),
        record_cpu_s=float(record_cpu_s),
    )


def contention_factor(profile: StorageProfile, streams: float) -> float:
    """How much slower the storage serves *streams* concurrent request streams than
    ``server_streams`` of them: ``streams / server_streams`` beyond them when the
    profile's ``contention`` is ``collapse``, else (``queue``, or no limit) 1."""
    if not profile.server_streams or profile.contention == "queue":
        return 1.0
    return max(1.0, streams / profile.server_streams)


def server_busy_s(profile: StorageProfile, requests: float, nbytes: float) -> float:
    """Seconds the storage servers' ``server_streams`` slots are busy serving *requests*
    requests of *nbytes* bytes in all, each paying ``seek_s`` (tiles start at random
    places) — the bound of a ``queue`` profile, whose servers keep their throughput under
    any number of streams but not their seek time (0 for other profiles)."""
    if profile.contention != "queue" or not profile.server_streams:
        return 0.0
    return (requests * profile.seek_s + nbytes / profile.stream_bw) / profile.server_streams


def unit_geometry(sh: Shape, unit: str) -> tuple[int, int, float]:
    """(units, units per node, mean samples per unit and step)."""
    if unit == "node":
        return sh.nodes, 1, sh.batch / sh.nodes
    return sh.ranks, -(-sh.ranks // sh.nodes), sh.batch / sh.ranks


def window_steps_for(sh: Shape, unit: str, window_bytes: int) -> int:
    """Steps per window: ``window_bytes`` of a unit's reads (0: as many as the cap allows),
    at most what the node's cap holds twice (one window consumed while the next is read)
    were its records the dataset's longest (:meth:`Shape.top_bytes`).

    Raises ConfigError when not even one step fits.
    """
    from .reads import LIVE_WINDOWS, PLAN_BYTES_PER_SAMPLE, most_that_fit

    P, M, B = sh.ranks, sh.nodes, sh.batch
    per_rank = -(-B // P)
    if unit == "node":
        unit_samples, units_per_node, mean_unit = per_rank * -(-P // M), 1, B / M
    else:
        unit_samples, units_per_node, mean_unit = per_rank, -(-P // M), B / P
    cap_unit = sh.cap // (LIVE_WINDOWS * units_per_node)
    meta = PLAN_BYTES_PER_SAMPLE if unit == "node" else 0  # the node's shared plan tables
    # w steps' records of a unit (distinct) at the longest
    worst = lambda w: sh.top_bytes(w * unit_samples) * sh.span + w * unit_samples * meta  # noqa: E731
    if worst(1) > cap_unit:
        raise ConfigError(
            f"memory cap {format_bytes(sh.cap)} per node cannot hold two steps of reads "
            f"({format_bytes(worst(1))} per {unit} and step at worst): raise memory_cap or "
            "lower the batch size"
        )
    steps = max(sh.steps, 1)
    if window_bytes > 0:
        target = math.ceil(window_bytes / max(mean_unit * sh.mean_len * sh.span, 1.0))
    else:
        target = steps
    return most_that_fit(lambda w: worst(w) <= cap_unit, max(1, min(target, steps)))


def estimate(
    sh: Shape, profile: StorageProfile, unit: str, tile_bytes: int, window_tiles: int
) -> Estimate:
    """The model's figures for one candidate (see the module docstring)."""
    U, units_per_node, mean_unit = unit_geometry(sh, unit)
    window_bytes = tile_bytes * window_tiles
    est = Estimate(unit, tile_bytes, window_bytes, 0, {})
    try:
        w = window_steps_for(sh, unit, window_bytes)
    except ConfigError as e:
        est.rejected = str(e)
        return est
    est.window_steps = w
    tile_rec = max(1, min(sh.n, round(tile_bytes / sh.mean_len)))
    tile_disk = tile_rec * sh.mean_len * sh.span
    share = sh.file_bytes / U  # bytes a unit reads per epoch
    wb = max(mean_unit * w, 1.0) * sh.mean_len * sh.span  # bytes per window
    wb = min(wb, share) if share else wb
    est.window_bytes = int(wb)
    nw = max(1, math.ceil(share / wb)) if share else 0
    k_win = wb / tile_disk + (1.0 if wb < sh.file_bytes else 0.0)  # pieces per window
    k_win = min(k_win, mean_unit * w)
    # the first w steps are cut into windows of w/8, w/8, w/4, w/2 (assign_window): a
    # cut more per extra window, and only the first of them is read before step 1
    sizes = window_sizes(w, sh.steps)
    extra = max(len(sizes) - math.ceil(max(sh.steps, 1) / w), 0)
    req_unit = nw * k_win + extra
    # the engine splits extents longer than its chunk into several requests
    sys_unit = req_unit + share / ENGINE_CHUNK
    tiles_total = max(1.0, sh.file_bytes / tile_disk)
    est.requests = U * req_unit
    est.bytes = sh.file_bytes
    est.readers = U
    est.windows_per_unit = nw
    est.tiles_per_window = k_win
    est.regions_per_batch = min(float(sh.batch), U * k_win, tiles_total * 1.0)
    from .reads import LIVE_WINDOWS

    est.memory_per_node = LIVE_WINDOWS * wb * units_per_node
    # bandwidth a reader gets, and contention at the servers
    readers_on_node = 1 if unit == "node" else units_per_node
    depth = READER_DEPTH
    if unit == "node":  # a node reader reads for its ranks, with their threads
        depth = reader_threads(READER_DEPTH, -(-sh.ranks // sh.nodes), profile, U)
    streams = U * depth
    f = contention_factor(profile, streams)
    per_reader_bw = min(
        profile.stream_bw * min(depth, max(profile.streams_per_node, 1)),
        profile.node_bw / readers_on_node,
    )
    # every window piece starts at a random place of the file: latency plus a seek
    lat = (profile.latency_s + profile.seek_s) * f
    t_lat = sys_unit * lat / depth
    t_bw = share / per_reader_bw
    t_agg = sh.file_bytes * f / profile.aggregate_bw if profile.aggregate_bw else 0.0
    t_srv = server_busy_s(profile, est.requests, sh.file_bytes)
    est.terms = {
        "latency": t_lat,
        "transfer": max(t_bw, t_agg, t_srv),
        "first_window": lat + wb * int(sizes[0]) / w / per_reader_bw,
        "coordination": sh.steps * COORD[unit]["step"] + nw * COORD[unit]["window"],
        "cpu": cpu_s(sh, profile, sh.file_bytes),
    }
    est.knobs = {
        "region": unit,
        "readers_per_node": 1 if unit == "node" else 0,
        "chunk_bytes": int(tile_bytes),
        "chunk": int(tile_rec),
        "window_bytes": int(window_bytes),
        "window_steps": int(w),
        "coalesce_bytes": int(min(tile_bytes, 8 * _MiB)),
    }
    return est


@dataclass
class Choice:
    """The chosen strategy, its estimate, and the runners-up (for ``--explain``)."""

    strategy: Strategy
    best: Estimate
    candidates: list[Estimate]
    profile: StorageProfile
    shape: Shape
    store_off: str = ""  # why the DeepIO store was not a candidate ("": it was)

    @property
    def store_verdict(self) -> str:
        """The DeepIO store: ``"chosen"``, ``"lost"`` (to a cheaper plan, over the cap or
        under the RL floor: :meth:`explain` says which), or ``"off: why"``."""
        if self.best.unit == "store":
            return "chosen"
        return f"off: {self.store_off}" if self.store_off else "lost"

    @property
    def runner_up(self) -> Estimate | None:
        """The cheapest qualifying candidate of the other kind than the choice (a
        window plan when the store won)."""
        other = [
            c
            for c in self.candidates
            if not c.rejected and (c.unit == "store") != (self.best.unit == "store")
        ]
        return min(other, key=lambda c: c.cost) if other else None

    def explain(self, top: int = 5) -> str:
        """The model's estimate term by term for the choice and the runners-up."""
        sh, p = self.shape, self.profile
        lines = [
            f"storage profile {p.name!r} ({p.source}): latency {p.latency_s * 1e3:.2f} ms, "
            f"stream {p.stream_bw / 1e9:.2f} GB/s, node {p.node_bw / 1e9:.2f} GB/s, "
            f"aggregate {'per node' if not p.aggregate_bw else f'{p.aggregate_bw / 1e9:.3g} GB/s'}"
            + (f", seek {p.seek_s * 1e3:.2f} ms" if p.seek_s else "")
            + (
                (
                    f", {p.server_streams} server slots (requests queue beyond them)"
                    if p.contention == "queue"
                    else f", contention beyond {p.server_streams} streams"
                )
                if p.server_streams
                else ""
            ),
            f"job: {sh.ranks} ranks on {sh.nodes} nodes, batch {sh.batch}, {sh.n} samples of "
            f"{sh.mean_len:.0f} B (read through their holes, tile edges allowed: "
            f"{sh.file_bytes / 1e9:.2f} GB), memory cap "
            f"{sh.cap / 1e9:.2f} GB per node",
            f"cpu term: {host_of(sh)[0]} ranks per host on {host_of(sh)[1]} cores"
            + (" (ranks take turns)" if host_of(sh)[0] > host_of(sh)[1] else "")
            + (f", decoding {sh.record_cpu_s * 1e6:.2g} us per record" if sh.record_cpu_s else "")
            + (
                f", storage CPU {p.host_cpu_per_byte * 1e9:.2g} ns per byte on the host"
                if p.host_cpu_per_byte
                else ""
            ),
            f"{'':2}{'candidate':<58}{'cost s':>9}{'latency':>9}{'transfer':>9}{'1st win':>9}"
            f"{'serve':>8}{'coord':>8}{'cpu':>8}{'requests':>11}{'mean read':>11}{'regions':>9}{'RL':>6}",
        ]
        ok = [c for c in self.candidates if not c.rejected]
        ok.sort(key=lambda c: c.cost)
        shown = [self.best, *[c for c in ok if c is not self.best][: top - 1]]
        stores = [c for c in ok if c.unit == "store" and c not in shown]
        shown += stores[:1]  # the store's best try, even when far down the list
        for c in shown:
            t = c.terms
            mark = "*" if c is self.best else " "
            rl = f"{c.rl:.3f}" if c.rl is not None else "  -  "
            lines.append(
                f"{mark} {c.label():<58}{c.cost:>9.3f}{t['latency']:>9.3f}{t['transfer']:>9.3f}"
                f"{t['first_window']:>9.3f}{t.get('serve', 0.0):>8.3f}{t['coordination']:>8.3f}"
                f"{t.get('cpu', 0.0):>8.3f}"
                f"{c.requests:>11.0f}{_fmt(c.mean_read):>11}{c.regions_per_batch:>9.0f}{rl:>6}"
            )
        rej = [c for c in self.candidates if c.rejected and c.unit != "store"]
        if rej:
            reasons: dict[str, int] = {}
            for c in rej:
                key = c.rejected.split(":")[0]
                reasons[key] = reasons.get(key, 0) + 1
            lines.append("rejected: " + "; ".join(f"{v} x {k}" for k, v in sorted(reasons.items())))
        lines.extend(self._explain_store())
        b = self.best
        if b.unit == "store":
            lines.append(
                f"chosen: {b.label()} — cheapest of {len(ok)} candidates over "
                f"{int(b.figures.get('horizon', 1))} epochs that fit the cap and reach RL >= "
                f"{self.strategy.rl_floor:g}"
            )
        else:
            lines.append(
                f"chosen: {b.label()} — cheapest of {len(ok)} candidates that fit the cap, "
                f"reach RL >= {self.strategy.rl_floor:g} and draw each global batch from >= "
                f"{min(MIX_REGIONS, sh.batch)} places of the file (or all of them)"
            )
        return "\n".join(lines)

    def _explain_store(self) -> list[str]:
        """The DeepIO store's lines: its terms, and why it won or lost (or why it was
        not a candidate)."""
        if self.store_off:
            return [f"DeepIO store: not a candidate ({self.store_off})"]
        tried = [c for c in self.candidates if c.unit == "store"]
        if not tried:
            return []
        lines = []
        for c in tried:
            head = f"DeepIO store, R={float(c.knobs.get('memory_fraction', 1.0)):g}"
            if c.rejected:
                lines.append(f"{head}: rejected ({c.rejected})")
                continue
            f = c.figures
            lines.append(
                f"{head}: epoch 1 {f['first_epoch_s']:.3f} s (loads {_fmt(c.bytes)} in "
                f"{c.requests:.0f} requests"
                + (
                    f", in {int(c.windows_per_unit)} rounds ramping up to 1/"
                    f"{int(f['load_rounds'])}: the first batch waits for the first"
                    if f.get("load_rounds")
                    else ""
                )
                + f"), later epochs {f['later_epoch_s']:.3f} s "
                f"(reads {'nothing' if float(c.knobs.get('memory_fraction', 1.0)) >= 1 else 'its rounds again'}"
                f"; {f['remote_gets']:.0f} remote gets, {_fmt(f['remote_bytes'])} from other "
                f"nodes), mean {c.cost:.3f} s per epoch over {int(f['horizon'])} epochs; "
                f"{_fmt(c.memory_per_node)} per node of a {_fmt(self.shape.cap)} cap"
            )
            if c is self.best:
                lines.append(
                    f"  -> won: {c.cost:.3f} s per epoch against "
                    + (
                        f"{self.runner_up.cost:.3f} s for the best window plan"
                        if self.runner_up is not None
                        else "no window plan that qualifies"
                    )
                )
            elif self.best.unit == "store":
                lines.append("  -> lost to the store at another R")
            else:
                why = (
                    f"RL {c.rl:.3f} < floor {self.strategy.rl_floor:g}"
                    if c.rl is not None and c.rl + 1e-12 < self.strategy.rl_floor
                    else f"{c.cost:.3f} s per epoch against {self.best.cost:.3f} s for the choice"
                )
                lines.append(f"  -> lost: {why}")
        return lines

    def to_dict(self) -> dict[str, Any]:
        hr, hc = host_of(self.shape)
        return {
            "profile": self.profile.to_dict(),
            "host": {"ranks": hr, "cores": hc, "record_cpu_s": self.shape.record_cpu_s},
            "store_off": self.store_off,
            "chosen": self.best.to_dict(),
            "strategy": self.strategy.to_dict(),
            "candidates": [c.to_dict() for c in self.candidates],
        }


def _window_rl(sh: Shape, c: Estimate) -> float:
    """RL of a ``window`` candidate: its windows (the first w steps cut finer, weighted
    by the samples they hold) as contiguous groups shuffled locally, a lower bound."""
    from .rl import rl_grouped

    _, _, mean_unit = unit_geometry(sh, c.unit)
    ww = weighted_window_steps(c.window_steps, sh.steps)
    return rl_grouped(sh.n, max(1, round(mean_unit * ww)), local_shuffle=True)


def choose(
    records,
    world: WorldSpec,
    batch_size: int,
    memory_cap: int,
    profile: StorageProfile | str | dict | None = None,
    *,
    base: Strategy | None = None,
    aggregate: bool = True,
    units: tuple[str, ...] | None = None,
    store: bool | str = True,
    epochs: int | None = None,
    host: tuple[int, int] | None = None,
    record_cpu_s: float = 0.0,
) -> Choice:
    """The cheapest plan for this job: a ``window`` plan, or the DeepIO store when
    ``base.store`` lets it be one (see the module docstring).

    Parameters
    ----------
    records : Records
        The dataset's records (sizes and layout).
    world : WorldSpec
    batch_size, memory_cap : int
        Global batch; bytes per node for read buffers.
    profile : StorageProfile, name, dict or None
        The storage (:func:`get_profile`; None: the parallel-file-system default).
    base : Strategy
        The preset whose other knobs are kept (default: ``PRESETS["feedline"]``).
    aggregate : bool
        Whether one reader per node may read for its node (needs MPI shared memory).
    units : tuple of str, optional
        Restrict who reads: ``("node",)`` or ``("rank",)``.
    store : bool or str
        Whether the DeepIO store can run here (the Loader's store source needs an MPI
        world with ``MPI_THREAD_MULTIPLE``, or one process); a string says why not. With
        ``base.store`` ``"auto"`` the store (ordered mode, R = 1 or 0.25, whichever fits
        the cap) competes with the ``window`` candidates on its mean cost over
        :data:`~feedline.plan.store_cost.EPOCH_HORIZON` epochs; ``"ordered"`` or
        ``"opportunistic"`` choose only R; ``"off"`` leaves it out.
    epochs : int, optional
        Epochs the job will read (the Loader's ``epochs=``): the store's cost is its
        mean per epoch over that many; None (unknown) weighs it over
        :data:`~feedline.plan.store_cost.EPOCH_HORIZON`. For a job that reads its data
        once (``epochs=1``) the store's load is the whole epoch's cost, so it wins only
        where loading beats reading windows.
    host : (int, int), optional
        Ranks on one host and that host's cores, for the ``cpu`` term (None: a node's
        ranks, a core each: a cluster's usual placement).
    record_cpu_s : float
        CPU seconds per record besides its copy (the Loader's decoding).
    """
    from .store_cost import EPOCH_HORIZON, FRACTIONS, store_candidate
    from .strategy import PRESETS

    base = base or PRESETS["feedline"]
    prof = get_profile(profile)
    sh = shape_of(records, world, batch_size, memory_cap, host, record_cpu_s)
    if units:
        who = list(units)
    else:
        who = ["rank"]
        if aggregate and world.nodes < world.size:
            who.append("node")
    store_off = ""
    if base.store == "off":
        store_off = "store='off'"
    elif base.assignment != "window":  # an order the caller fixed (shuffle=False)
        store_off = f"the order is fixed (assignment={base.assignment!r})"
    elif store is not True:
        store_off = store if isinstance(store, str) and store else "not available here"
    if base.store in ("ordered", "opportunistic"):
        if store_off:
            raise ConfigError(f"store={base.store!r} cannot run here: {store_off}")
        who = []  # the store was asked for: only its memory fraction is chosen
    tiles = list(TILE_BYTES)
    small = int(sh.file_bytes / MIN_TILES / sh.span)
    if small < TILE_BYTES[0]:  # small datasets: tiles that still cut the file in 32 places
        tiles.insert(0, max(int(sh.mean_len), small))
    cands = [estimate(sh, prof, u, t, k) for u in who for t in tiles for k in WINDOW_TILES]
    # the same window reached twice (capped): keep one
    seen: set[tuple] = set()
    uniq = []
    for c in cands:
        key = (c.unit, c.tile_bytes, c.window_steps)
        if key not in seen:
            seen.add(key)
            uniq.append(c)
    cands = uniq
    if not store_off:
        mode = base.store if base.store in ("ordered", "opportunistic") else "ordered"
        H = EPOCH_HORIZON if epochs is None else epochs
        cands += [
            store_candidate(sh, prof, R, mode=mode, horizon=H, rl_floor=base.rl_floor)
            for R in FRACTIONS
        ]
    for c in cands:
        if c.rejected or c.unit == "store":
            continue
        tiles_total = sh.file_bytes / max(c.tile_bytes * sh.span, 1.0)
        need_tiles = min(float(MIN_TILES), float(sh.n))
        need = min(float(MIX_REGIONS), float(sh.batch), float(sh.n))
        if tiles_total + 1e-9 < need_tiles:
            c.rejected = f"tiles too large: {tiles_total:.1f} tiles in the file < {need_tiles:.0f}"
        elif c.regions_per_batch + 1e-9 < need:
            c.rejected = (
                f"mixes too little: {c.regions_per_batch:.0f} places per batch < {need:.0f}"
            )
    ok = sorted((c for c in cands if not c.rejected), key=lambda c: (c.cost, c.requests))
    best = None
    for c in ok:
        if c.unit != "store":  # the store's RL is its own (rl_memory)
            c.rl = _window_rl(sh, c)
        assert c.rl is not None
        if c.rl + 1e-12 >= base.rl_floor:
            best = c
            break
        c.rejected = f"RL {c.rl:.3f} < floor {base.rl_floor:g}"
    if best is None:
        # nothing reaches the floor (a tiny dataset or cap): the best shuffle that fits
        fits = [c for c in cands if not c.rejected.startswith("memory cap")]
        fits = [c for c in fits if c.window_steps or c.unit == "store"]
        if not fits:
            raise ConfigError(
                next((c.rejected for c in cands if c.rejected), "no candidate plan")
                + " (feedline preset)"
            )
        for c in fits:
            if c.rl is None:
                c.rl = _window_rl(sh, c)
        best = max(fits, key=lambda c: (round(c.rl or 0.0, 6), -c.cost))
    strategy = base.replace(auto=False, **best.knobs)
    return Choice(strategy, best, cands, prof, sh, store_off)
