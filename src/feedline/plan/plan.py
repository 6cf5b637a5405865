# SPDX-License-Identifier: Apache-2.0
"""The Plan: who consumes which samples at each step, and who reads which bytes.

``make_plan`` is pure (no I/O, no MPI): from the records, the world, the strategy, the
seed and the epoch it builds an object that answers per-rank questions in
O(samples / ranks) — ``samples(rank, step)``, ``node_samples(node, step)``,
``reads(reader)`` — without materialising P x steps lists. The epoch order is the
assignment's base sequence (:mod:`feedline.plan.streams`) placed by its layout
(:mod:`feedline.plan.layout`).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import defaults
from ..errors import ConfigError, StateError
from ._perm import derive_key
from .layout import Geometry, even_start, floor_start
from .records import CountOnly, Records, as_records
from .strategy import Strategy, get_strategy
from .streams import Explicit, get_assignment
from .world import WorldSpec


class _Shifted:
    """An explicit remainder addressed by global position (positions start at *base*)."""

    def __init__(self, ids: np.ndarray, base: int) -> None:
        self.inner = Explicit(ids)
        self.base = base
        self.n = base + self.inner.n

    def take(self, q):
        return self.inner.take(np.asarray(q, dtype=np.int64) - self.base)


def epoch_key(seed: int, epoch: int, assignment: str) -> np.uint64:
    """The 64-bit key of an epoch's randomness: a pure function of (seed, epoch, assignment)."""
    if seed < 0 or epoch < 0:
        raise ConfigError("seed and epoch must be >= 0")
    return derive_key(seed, epoch, zlib.crc32(assignment.encode()))


@dataclass(frozen=True)
class Plan:
    """An epoch's plan for one world. Build it with :func:`make_plan`.

    Attributes
    ----------
    records : Records
        Where samples live.
    world : WorldSpec
    strategy : Strategy
    seed, epoch, batch_size : int
    drop_last : bool
    first_step : int
        First step this plan delivers (> 0 for a resumed plan).
    memory_cap : int
        Bytes per node for read buffers (coalesced windows are sized under it).
    """

    records: Records
    world: WorldSpec
    strategy: Strategy
    seed: int
    epoch: int
    batch_size: int
    drop_last: bool
    first_step: int
    memory_cap: int
    _geo: Geometry
    _stream: Any
    _layout: str

    # ------------------------------------------------------------------ shape
    @property
    def n(self) -> int:
        """Samples in the dataset."""
        return self.records.n

    @property
    def num_steps(self) -> int:
        """Steps in the epoch (every rank runs all of them, some possibly empty)."""
        return self._geo.steps

    @property
    def total(self) -> int:
        """Samples delivered over the whole epoch (N, or S·B with circular/drop_last)."""
        return self._geo.total

    def step_len(self, step: int) -> int:
        """Samples in *step* across all ranks."""
        self._check_step(step)
        return int(self._geo.step_len(step))

    def bounds(self, step: int) -> np.ndarray:
        """The P+1 sub-batch bounds of *step* (see :func:`sub_batch_bounds`)."""
        from .layout import sub_batch_bounds

        return sub_batch_bounds(self.step_len(step), self.world.size)

    def _check_step(self, step: int) -> None:
        if not 0 <= step < self.num_steps:
            raise IndexError(f"step {step} outside [0, {self.num_steps})")

    # ------------------------------------------------------------ consumption
    def ids_at(self, positions) -> np.ndarray:
        """Sample ids at global positions of the epoch order (vectorised)."""
        q = self._geo.to_stream(np.asarray(positions, dtype=np.int64), self._layout)
        if (
            self.total > self.n
            and not isinstance(self._stream, _Shifted)
            and not getattr(self._stream, "wraps", False)
        ):
            # circular: the last step wraps to the start of the order
            q = q % self.n
        return self._stream.take(q)

    def samples(self, rank: int, step: int) -> np.ndarray:
        """Global ids of *rank*'s sub-batch at *step* (int64, possibly empty)."""
        self._check_step(step)
        if step < self.first_step:
            raise IndexError(f"step {step} precedes the first step {self.first_step} of this plan")
        lo, hi = self._geo.rank_range(step, rank)
        return self.ids_at(np.arange(lo, hi, dtype=np.int64))

    def rank_samples(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """All of *rank*'s samples from ``first_step`` on, and per-step offsets.

        Returns ``(ids, offsets)`` with ``ids[offsets[i]:offsets[i+1]]`` the sub-batch of
        step ``first_step + i``. O(samples / ranks).
        """
        steps = np.arange(self.first_step, self.num_steps, dtype=np.int64)
        L = self._geo.step_len(steps)
        P = self.world.size
        lo = steps * self.batch_size + even_start(L, P, rank)
        cnt = even_start(L, P, rank + 1) - even_start(L, P, rank)
        offsets = np.zeros(len(steps) + 1, dtype=np.int64)
        np.cumsum(cnt, out=offsets[1:])
        pos = np.repeat(lo - offsets[:-1], cnt) + np.arange(offsets[-1], dtype=np.int64)
        return self.ids_at(pos), offsets

    def node_range(self, node: int, step: int) -> tuple[int, int]:
        """Global positions ``[lo, hi)`` a node's ranks consume at *step*."""
        ranks = self.world.ranks_of(node)
        lo, _ = self._geo.rank_range(step, ranks.start)
        _, hi = self._geo.rank_range(step, ranks.stop - 1)
        return lo, hi

    def node_samples(self, node: int, step: int) -> np.ndarray:
        """What *node*'s readers bring for *step*: its ranks' sub-batches in rank order."""
        self._check_step(step)
        lo, hi = self.node_range(node, step)
        return self.ids_at(np.arange(lo, hi, dtype=np.int64))

    def order(self) -> np.ndarray:
        """The whole epoch order from ``first_step`` (O(N): for tests and tools)."""
        return self.ids_at(np.arange(self.first_step * self.batch_size, self.total, dtype=np.int64))

    # ----------------------------------------------------------------- resume
    def samples_after(self, step: int) -> np.ndarray:
        """Ids not yet consumed once steps ``[0, step)`` are done, in epoch order."""
        if not 0 <= step <= self.num_steps:
            raise StateError(f"step {step} outside [0, {self.num_steps}]")
        start = max(step, self.first_step) * self.batch_size
        return self.ids_at(np.arange(start, self.total, dtype=np.int64))

    def resume(self, step: int, world: WorldSpec | None = None) -> Plan:
        """The plan delivering exactly the rest of this epoch after *step* steps.

        At the same world size — or for any world when the assignment does not depend on
        it — this is the same plan starting at *step*. Otherwise the remaining order is
        re-cut for the new world (same batch size, same step numbers).
        """
        world = world or self.world
        if not 0 <= step <= self.num_steps:
            raise StateError(f"cannot resume at step {step}: the epoch has {self.num_steps} steps")
        same = (world.size, world.nodes) == (self.world.size, self.world.nodes) or get_assignment(
            self.strategy.assignment
        ).world_independent(self.strategy)
        geo = Geometry(
            self.n,
            self.batch_size,
            world.size,
            drop_last=self.drop_last,
            circular=self.strategy.circular,
            nodes=world.nodes,
        )
        if same or isinstance(self._stream, _Shifted):
            stream, layout = self._stream, self._layout
        else:
            stream, layout = _Shifted(self.samples_after(step), step * self.batch_size), "row"
        return Plan(
            records=self.records,
            world=world,
            strategy=self.strategy,
            seed=self.seed,
            epoch=self.epoch,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            first_step=step,
            memory_cap=self.memory_cap,
            _geo=geo,
            _stream=stream,
            _layout=layout,
        )

    def rebase(self, strategy: Strategy) -> Plan:
        """The rest of this plan (from ``first_step``) delivered under *strategy*'s
        reads: the same remaining order, as an explicit sequence (e.g. a checkpoint made
        under another ``feedline`` choice)."""
        rest = _Shifted(self.samples_after(self.first_step), self.first_step * self.batch_size)
        return Plan(
            records=self.records,
            world=self.world,
            strategy=strategy,
            seed=self.seed,
            epoch=self.epoch,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            first_step=self.first_step,
            memory_cap=self.memory_cap,
            _geo=self._geo,
            _stream=rest,
            _layout="row",
        )

    # ---------------------------------------------------------------- readers
    def readers_of(self, node: int) -> list[int]:
        """Reader ranks of *node* (every rank when the strategy does not aggregate)."""
        ranks = self.world.ranks_of(node)
        if self.strategy.readers_per_node is None and self.world.readers_per_node > 0:
            k = min(self.world.readers_per_node, len(ranks))
        else:
            k = self.strategy.readers_for(len(ranks))
        return [ranks[floor_start(len(ranks), k, i)] for i in range(k)]

    @property
    def readers(self) -> list[int]:
        """All reader ranks, node by node (the staggering order)."""
        return [r for node in range(self.world.nodes) for r in self.readers_of(node)]

    def reads(self, reader: int) -> list:
        """Ordered read operations of *reader* (see :mod:`feedline.plan.reads`)."""
        from .reads import reads_of

        return reads_of(self, reader)

    def stagger(self, reader: int):
        """Token/group information of *reader* (see :mod:`feedline.plan.stagger`)."""
        from .stagger import stagger_info

        return stagger_info(self, reader)

    def describe(self) -> dict[str, Any]:
        """Small JSON-able summary (for loader state and the CLI)."""
        return {
            "n": self.n,
            "ranks": self.world.size,
            "nodes": self.world.nodes,
            "batch_size": self.batch_size,
            "steps": self.num_steps,
            "first_step": self.first_step,
            "seed": self.seed,
            "epoch": self.epoch,
            "drop_last": self.drop_last,
            "strategy": self.strategy.to_dict(),
        }


def make_plan(
    source,
    world: WorldSpec | int,
    strategy: Strategy | str = "feedline",
    seed: int = 0,
    epoch: int = 0,
    batch_size: int = 1,
    drop_last: bool = False,
    *,
    memory_cap: int | None = None,
    profile=None,
    aggregate: bool = True,
) -> Plan:
    """Plan one epoch.

    Parameters
    ----------
    source : Index, Records, (file_ids, offsets, lengths) or int
        The samples (a bare count plans sample ids but not reads).
    world : WorldSpec or int
        The job shape (an int is P ranks on one node).
    strategy : Strategy or str
        A Strategy or a preset name.
    seed, epoch : int
        The order is a pure function of (n, strategy, seed, epoch) — and of P only for
        assignments that depend on it by definition (skip, contiguous, chunk/rank).
    batch_size : int
        Global batch B.
    drop_last : bool
        Drop the last partial step.
    memory_cap : int, optional
        Bytes per node for read buffers; default ``feedline.defaults.get("memory_cap")``.
    profile : StorageProfile, str or dict, optional
        The storage the cost model plans for when the strategy is ``auto`` (the
        ``feedline`` preset); default: the parallel-file-system profile
        (:mod:`feedline.plan.cost`).
    aggregate : bool
        ``auto`` only: whether one reader per node may read for its node.

    Returns
    -------
    Plan
    """
    records = as_records(source)
    if isinstance(world, int):
        world = WorldSpec(world)
    strategy = get_strategy(strategy)
    if batch_size < 1:
        raise ConfigError(f"batch size must be >= 1, got {batch_size}")
    if strategy.circular and drop_last:
        raise ConfigError("circular and drop_last exclude each other")
    cap = int(defaults.get("memory_cap") if memory_cap is None else memory_cap)
    if cap < 1:
        raise ConfigError("memory_cap must be positive")
    if strategy.auto:
        from .cost import choose

        strategy = choose(
            records, world, batch_size, cap, profile, base=strategy, aggregate=aggregate
        ).strategy
    a = get_assignment(strategy.assignment)
    key = epoch_key(int(seed), int(epoch), strategy.assignment)
    n = records.n
    geo = Geometry(
        n,
        batch_size,
        world.size,
        drop_last=drop_last,
        circular=strategy.circular,
        nodes=world.nodes,
    )
    if strategy.assignment == "window":
        stream = _window_stream(records, world, strategy, key, geo, cap, batch_size)
    elif a.make_geo:  # the epoch: a progressive store's epoch 0 is its own order
        stream = a.make_geo(n, strategy, key, geo, records, int(epoch))
    else:
        stream = a.make(n, strategy, key)
    return Plan(
        records=records,
        world=world,
        strategy=strategy,
        seed=int(seed),
        epoch=int(epoch),
        batch_size=int(batch_size),
        drop_last=bool(drop_last),
        first_step=0,
        memory_cap=cap,
        _geo=geo,
        _stream=stream,
        _layout=a.layout(strategy),
    )


def _window_stream(records, world, strategy, key, geo, cap, batch_size):
    """The ``window`` assignment's stream: tiles and windows sized for this job."""
    from .assign_window import WindowStream, tile_records
    from .cost import shape_of, window_steps_for

    if strategy.circular:
        raise ConfigError("the window assignment does not wrap (circular=False)")
    unit = "node" if strategy.region == "node" else "rank"
    mean = records.mean_length if records.n else 1.0
    if isinstance(records, CountOnly):
        w = max(1, geo.steps)
        tile = max(1, strategy.chunk or 64)
    else:
        if strategy.window_steps:
            w = strategy.window_steps
        else:
            w = window_steps_for(
                shape_of(records, world, batch_size, cap), unit, strategy.window_bytes
            )
        tile = tile_records(strategy, mean, records.n)
        span = int(getattr(records, "span_rows", 1))
        if span > 1:  # compressed HDF5: tiles of whole chunks (each read and unpacked once)
            tile = min(-(-tile // span) * span, max(records.n, 1))
    return WindowStream(records.n, tile, w, key, geo, unit)


def epoch_order(
    n: int,
    strategy: Strategy | str,
    seed: int = 0,
    epoch: int = 0,
    *,
    world_size: int = 1,
    batch_size: int | None = None,
    drop_last: bool = False,
) -> np.ndarray:
    """The global sample order of an epoch (int64 ids; O(n)).

    *world_size* and *batch_size* matter only for assignments that depend on them
    (skip, contiguous, chunk with the rank layout; the column layout depends on B);
    ``batch_size=None`` means one step of n.
    """
    b = batch_size or max(n, 1)
    return make_plan(n, WorldSpec(world_size), strategy, seed, epoch, b, drop_last).order()


def rank_samples(
    order: np.ndarray, step: int, rank: int, world: WorldSpec | int, batch_size: int
) -> np.ndarray:
    """Rank *rank*'s sub-batch of *step* from an explicit epoch *order*."""
    from .layout import sub_batch_bounds

    P = world.size if isinstance(world, WorldSpec) else int(world)
    lo = step * batch_size
    if not 0 <= lo < max(len(order), 1) and not (lo == 0 and len(order) == 0):
        raise IndexError(f"step {step} outside the order")
    step_ids = order[lo : lo + batch_size]
    b = sub_batch_bounds(len(step_ids), P)
    return np.asarray(step_ids[b[rank] : b[rank + 1]], dtype=np.int64)
