"""``node``: k readers per node fill a node shared-memory window; every rank copies out.

LMDBIO's LMM pattern without mmap: the plan (``feedline.plan.reads``) gives each of a
node's k reader ranks one coalesced read operation per window of w steps covering the
node's samples. The readers read into one half of a double-buffered window allocated
with ``Win.Allocate_shared`` (``World.node_array``); every rank of the node then copies
its own sub-batch out, in delivery order. At the start of each window the node meets
once (a polled allgather that also carries failures, so an I/O error on a reader is
raised on every rank of the node instead of leaving them waiting): window r is then
complete, and the half that held window r-1 is free, so the readers start reading
window r+1 into it while the ranks consume window r. Fewer, larger reads per node and
a single copy per sample, for one node-wide synchronisation per window. All ranks of a
node must iterate in lockstep (as data-parallel training does).
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from .reader import ExtentReader, ReadList, gather
from .source import RawBatch, Source, SourceContext, register_source


def window_layout(plan, ops, steps: range, rank: int, first_rank: int) -> dict:
    """Where *rank*'s samples of one read window lie, in (step, slot) order.

    *ops* are the window's read operations (laid out back to back in the buffer), *steps*
    the steps the window serves, and *first_rank* the first rank whose sub-batch the
    buffer holds (the node's first rank when readers aggregate, else *rank* itself).
    Returns ``ids``, ``src`` (byte offset in the buffer), ``size``, per-step ``bounds``
    and ``steps``.
    """
    bases = np.cumsum([0] + [o.nbytes for o in ops])[:-1]
    step = np.concatenate([o.step for o in ops])
    slot = np.concatenate([o.slot for o in ops])
    src = np.concatenate([o.src + b for o, b in zip(ops, bases, strict=True)])
    size = np.concatenate([o.size for o in ops])
    ids = np.concatenate([o.ids for o in ops])
    # a rank's sub-batch is the slots [lo, hi) of the buffer's list at each step
    st = np.arange(steps.start, steps.stop, dtype=np.int64)
    L = plan._geo.step_len(st)
    P = plan.world.size

    def bound(x):
        return x * (L // P) + np.minimum(x, L % P)

    lo = bound(rank) - bound(first_rank)
    hi = bound(rank + 1) - bound(first_rank)
    k = step - steps.start
    mine = (slot >= lo[k]) & (slot < hi[k])
    order = np.lexsort((slot[mine], step[mine]))
    return {
        "ids": ids[mine][order],
        "src": src[mine][order],
        "size": size[mine][order],
        "bounds": np.searchsorted(step[mine][order], np.arange(steps.start, steps.stop + 1)),
        "steps": steps,
    }


class _Failed:
    """A picklable marker of a reader's failure, carried to the node's other ranks."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class NodeWindowSource(Source):
    """k readers per node read into a node window (two halves); ranks copy out."""

    name = "node"

    def __init__(self, ctx: SourceContext) -> None:
        super().__init__(ctx)
        if ctx.world is None:
            raise ValueError("the node source needs an MPI World (feedline.dist)")
        self.world = ctx.world
        self._reader: ExtentReader | None = None
        self._shm: Any = None
        self._pending: Any = None
        self._windows: list = []
        self._stats = {"window_bytes": 0, "node_syncs": 0, "read_windows": 0}

    # ---------------------------------------------------------------- setup
    def start(self, plan, first_step: int) -> None:
        from ..plan.reads import unit_of, window_ops, windows

        self.stop()
        rank, world = self.ctx.rank, self.world
        node = plan.world.node_of(rank)
        readers = plan.readers_of(node)
        self._is_reader = rank in readers
        self._my = readers.index(rank) if self._is_reader else -1
        unit, _ = unit_of(plan, readers[0])
        ranks = plan.world.ranks_of(node)
        self._plan = plan
        self._steps = windows(plan)
        # every rank computes all readers' operations (pure): where each sample lands
        self._ops = [
            window_ops(plan, unit, readers, r, steps) for r, steps in enumerate(self._steps)
        ]
        sizes = [sum(op.nbytes for op in ops) for ops in self._ops]
        half = max(sizes, default=0)
        if self._is_reader and self._reader is None:
            self._reader = ExtentReader(
                self.ctx.dataset.files, self.ctx.options.io_threads, plan.strategy.read
            )
        self._shm = world.node_array((2, max(half, 1)), np.uint8, owner=0)
        self._stats["window_bytes"] = 2 * half
        self._rank_lo = ranks.start
        self._win = -1  # window whose data the consumer currently reads
        self._err: BaseException | None = None
        if self._is_reader and self._steps:
            self._pending = self._read_window(0)

    def _read_window(self, r: int):
        op = self._ops[r][self._my]
        base = sum(o.nbytes for o in self._ops[r][: self._my])
        dest = np.zeros(len(op.lengths), dtype=np.int64)
        if len(op.lengths) > 1:
            np.cumsum(op.lengths[:-1], out=dest[1:])
        view = self._shm.array[r % 2, base : base + op.nbytes]
        assert self._reader is not None
        self._stats["read_windows"] += 1
        return self._reader.submit(ReadList(op.file_ids, op.offsets, op.lengths, dest), view)

    def _sync(self, r: int) -> None:
        """Node meeting at the start of window r: r is complete, r-1's half is free."""
        failure = None
        if self._pending is not None:
            try:
                self._pending.result()
            except BaseException as e:
                failure = _Failed(e)
            self._pending = None
        got = self.world.allgather(failure, comm=self.world.node_comm)
        self._stats["node_syncs"] += 1
        for f in got:
            if isinstance(f, _Failed):
                raise f.exc
        self._index_window(r)
        if self._is_reader and r + 1 < len(self._steps):
            self._pending = self._read_window(r + 1)

    def _index_window(self, r: int) -> None:
        """This rank's samples in window r: (step, slot) order, byte positions in the half."""
        self._cur = window_layout(
            self._plan, self._ops[r], self._steps[r], self.ctx.rank, self._rank_lo
        )
        self._win = r

    # -------------------------------------------------------------- consumer
    def get(self, step: int) -> RawBatch:
        while self._win < 0 or step >= self._steps[self._win].stop:
            self._sync(self._win + 1)
        cur = self._cur
        i = step - cur["steps"].start
        a, b = int(cur["bounds"][i]), int(cur["bounds"][i + 1])
        if a == b:
            return RawBatch.empty()
        half = self._shm.array[self._win % 2]
        data = gather(half, cur["src"][a:b], cur["size"][a:b])
        return RawBatch(cur["ids"][a:b], data, cur["size"][a:b])

    # ------------------------------------------------------------- lifecycle
    def stop(self) -> None:
        if self._pending is not None:
            with contextlib.suppress(BaseException):
                self._pending.result()  # never free memory the engine still writes
            self._pending = None
        if self._shm is not None:
            shm, self._shm = self._shm, None
            if not _mpi_finalized():  # at interpreter exit MPI may already be gone
                shm.free()  # collective over the node

    def memory_bytes(self, plan) -> int:
        from ..plan.reads import window_steps

        # two halves of one window of the node's samples (the planner keeps holes within
        # the cap); per rank, since the Loader multiplies by the ranks of a node
        rpn = max(1, self.ctx.ranks_per_node)
        unit = -(-plan.batch_size // plan.world.size) * rpn
        return 2 * window_steps(plan) * unit * int(plan.records.max_length) // rpn

    def stats(self) -> dict[str, Any]:
        st = (
            self._reader.stats()
            if self._reader is not None
            else {"storage_bytes": 0, "storage_ops": 0, "io_s": 0.0}
        )
        st.update(self._stats, reader=bool(getattr(self, "_is_reader", False)))
        st["buffer_bytes"] = self._stats["window_bytes"]
        return st

    def close(self) -> None:
        self.stop()
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def _mpi_finalized() -> bool:
    from mpi4py import MPI

    return bool(MPI.Is_finalized())


register_source(NodeWindowSource)
