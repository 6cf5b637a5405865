# SPDX-License-Identifier: Apache-2.0
"""How :class:`~feedline.sources.lmdbio.LmdbioSource` finds and reads records, one class
per mode (docs/lmdbio.md, "Who reads what, how, when").

The source owns what every preset shares: the node's readers and this rank's place
among them, the buffer of two halves (a node window when aggregated), the node meeting,
the counters, the staggering token, ``stop`` and ``close``. A mode owns what differs:

- :class:`Cursor` (``cursor``: ``lmdb``, ``lmm``, ``skip``, ``contiguous``) — each
  reader walks its own liblmdb cursor over mmap.
- :class:`DM` (``dm``: ``lmm-dm``) — speculative prefetch and an in-memory walk from the
  portable cursor that the readers hand on, one after another.
- :class:`DIO` (``dio``: ``lmm-dio``) — one locating process broadcasts the extents of
  the coming steps; the readers read them with ``pread``.
- :class:`Index` (``index``: the seeking presets on a dataset that is not an LMDB) —
  extents from the index, read with the strategy's method.
- :class:`Prov` (``prov``: ``lmm-dio-prov``, ``-coal``, ``-coal-stag``) — the planner's
  read windows of one or more steps, extents from provenance (the index sidecar).

Hooks, in the order the source calls them. ``start``: :meth:`_Mode.open` (readers
only; a failure is held until the collectives below are done), :meth:`_Mode.setup`
(every rank), :meth:`_Mode.half_bytes` (the source then allocates the buffer, a
collective over the node), :meth:`_Mode.ready`. Per step: :meth:`_Mode.get`, which
for all but PROV is the source's shared step (:meth:`LmdbioSource._step_batch`) around
:meth:`_Mode.read_part`. Then :meth:`_Mode.stop` and :meth:`_Mode.close`.

The source keeps one mode object per mode name for its whole life, so what a mode opens
(a liblmdb map, the DM reader, the locator, the hand-off communicator) is opened once
and kept across passes until ``close``, and the collectives of every rank stay in the
same order: the per-pass ones are in ``setup``, ``get`` and the source.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..dist import ops as mpi
from ..errors import FeedlineError
from ..pipeline.reader import ReadList, gather
from .base import RawBatch
from .lmdb_readers import Locator, MmapCursor, PageCursor, Speculative, open_cursor, read_extents
from .lmdb_walk import MAX_DEPTH, WalkCursor

if TYPE_CHECKING:  # pragma: no cover
    from .lmdbio import LmdbioSource

_TAG = 0x4C4D  # cursor hand-off messages (on DM's own communicator)
_MSG = 2 + 2 + 2 * MAX_DEPTH  # generation, step, then WalkCursor.pack()
_LOCATE_RECORDS = 8192  # lmm-dio locates the records of ceil(8192 / B) steps at a time


class _Failed:
    """A reader's failure carried to the other ranks of its node."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _method(read: str) -> str:
    """The engine's read method for DIO and PROV: ``pread`` where the strategy says mmap."""
    return "pread" if read == "mmap" else read


class _Mode:
    """One way of finding and reading records; the default hooks do nothing."""

    #: what ``stats()["mode"]`` reports
    name: ClassVar[str] = ""

    def __init__(self, src: LmdbioSource) -> None:
        self.src = src

    def open(self, plan) -> None:
        """Open what this reader reads with (readers only; kept across passes)."""

    def setup(self, plan) -> BaseException | None:
        """Every rank, after ``open``: the pass's state and the mode's collectives. An
        exception raised here propagates at once; one returned is raised by ``start``
        after the buffer is allocated (as a failure of ``open`` is)."""
        return None

    def half_bytes(self) -> int:
        """Bytes of one buffer half: one step of the unit's records at the largest record
        size (the rank's sub-batch, or the node's ranks' when aggregated)."""
        src = self.src
        plan = src.plan
        ranks = len(src.node_ranks) if src.aggregated else 1
        return -(-plan.batch_size // plan.world.size) * ranks * src.max_len

    def ready(self) -> None:
        """After the buffer is allocated (every rank)."""

    def get(self, step: int) -> RawBatch:
        """This rank's records of *step*."""
        return self.src._step_batch(step, self.read_part)

    def read_part(self, step: int, ids: np.ndarray, dest: np.ndarray) -> np.ndarray:
        """Read this reader's records *ids* of *step* back to back into *dest*; their
        lengths."""
        raise NotImplementedError

    def storage(self) -> tuple[int, int]:
        """(bytes, ops) asked of storage beyond the counters and the engine's."""
        return 0, 0

    def stats(self, c: dict[str, Any]) -> dict[str, Any]:
        """Statistics of this mode's own, from the counters *c*."""
        return {}

    def stop(self) -> None:
        """The pass is abandoned or done: complete what is in flight."""

    def close(self) -> None:
        """Release what ``open`` and ``setup`` kept."""

    @classmethod
    def memory(cls, plan, unit: int) -> int:
        """Bytes held at most for the records of *unit* ranks' sub-batches: the two
        halves of one step."""
        return 2 * unit * int(plan.records.max_length)


# ------------------------------------------------------------------- cursor
class Cursor(_Mode):
    """Each reader's liblmdb cursor over mmap (:func:`open_cursor`), stepped to its
    records: Caffe's strided order, MPI-Caffe's read-one-skip-(P-1) or regions."""

    name = "cursor"

    def __init__(self, src: LmdbioSource) -> None:
        super().__init__(src)
        self.cursor: MmapCursor | PageCursor | None = None

    def open(self, plan) -> None:
        if self.cursor is None:
            src = self.src
            self.cursor = open_cursor(src._path, src.c, lambda: src._engine_for("pread"))

    def read_part(self, step: int, ids: np.ndarray, dest: np.ndarray) -> np.ndarray:
        assert self.cursor is not None
        return self.cursor.read(ids, dest)

    def storage(self) -> tuple[int, int]:
        """The mmap cursor's touched pages (estimate) and major faults."""
        return self.cursor.storage() if self.cursor is not None else (0, 0)

    def close(self) -> None:
        if self.cursor is not None:
            self.cursor.close()
            self.cursor = None


# ----------------------------------------------------------------------- DM
class DM(_Mode):
    """LMDBIO-DM: the readers form a ring (node by node); each prefetches its guess,
    waits for the cursor from the previous reader, walks to its records in memory, and
    sends the cursor on before copying (nonblocking MPI on a duplicated communicator)."""

    name = "dm"

    def __init__(self, src: LmdbioSource) -> None:
        super().__init__(src)
        self.spec: Speculative | None = None
        self.comm: Any = None  # duplicated once, on every rank, for the hand-off
        self.sends: list[Any] = []  # (request, message) pairs not known to be done
        self.ring: list[int] = []
        self.g = -1  # this reader's place in the ring
        self.held: WalkCursor | None = None  # the cursor this reader ended at

    def open(self, plan) -> None:
        if self.spec is None:
            src = self.src
            self.spec = Speculative(src._path, src._engine_for("pread"), src.c)

    def setup(self, plan) -> BaseException | None:
        src = self.src
        if self.comm is None and src.world is not None and src.world.size > 1:
            self.comm = mpi.dup(src.world.comm)  # collective: every rank, once
        if not src.is_reader:
            return None
        self.ring = plan.readers if src.aggregated else list(range(plan.world.size))
        if src.world is None:
            self.ring = [src.ctx.rank]
        self.g = self.ring.index(src.ctx.rank)
        self.held = None
        return None

    def read_part(self, step: int, ids: np.ndarray, dest: np.ndarray) -> np.ndarray:
        spec = self.spec
        assert spec is not None
        R, g = len(self.ring), self.g
        if len(ids):
            spec.prefetch(int(ids[0]), int(ids[-1]) + 1)  # speculative, before the cursor
        cursor = self.held
        if R > 1 and not (step == self.src.first and g == 0):
            cursor = self._recv_cursor(step)
        found = None
        try:
            if len(ids):
                cursor, found = spec.seek(cursor, ids)
        except BaseException:
            self._send_cursor(step, None, failed=True)
            raise
        self.held = cursor
        self._send_cursor(step, cursor)  # the next reader seeks while this one copies
        return spec.copy(found, dest) if found is not None else np.zeros(0, dtype=np.int64)

    def _successor(self, step: int) -> int | None:
        R, g = len(self.ring), self.g
        if R == 1 or (g == R - 1 and step == self.src.plan.num_steps - 1):
            return None
        return self.ring[(g + 1) % R]

    def _send_cursor(self, step: int, cursor: WalkCursor | None, failed: bool = False) -> None:
        dest = self._successor(step)
        if dest is None:
            return
        nxt = step + 1 if self.g == len(self.ring) - 1 else step
        msg = np.full(_MSG, -1, dtype=np.int64)
        msg[0], msg[1] = self.src._gen, nxt
        if failed:
            msg[2] = -2  # poison: this reader failed; the next one must not wait forever
        elif cursor is not None:
            msg[2:] = cursor.pack()
        self.sends.append((mpi.isend(self.comm, msg, dest, _TAG), msg))
        self.sends = [(r, m) for r, m in self.sends if not mpi.done(r)]

    def _recv_cursor(self, step: int) -> WalkCursor | None:
        src = self.src
        prev = self.ring[(self.g - 1) % len(self.ring)]
        buf = np.empty(_MSG, dtype=np.int64)
        t0 = time.perf_counter()
        while True:
            src._poll(mpi.irecv(self.comm, buf, prev, _TAG))
            if buf[0] == src._gen and buf[1] == step:
                break  # older generations are leftovers of an abandoned pass
        src._wait_add("handoff_wait_s", t0)
        if buf[2] == -2:
            raise FeedlineError(f"reader rank {prev} failed before handing over the LMDB cursor")
        if buf[3] <= 0:
            return None
        return WalkCursor.unpack(buf[2:])

    def stats(self, c: dict[str, Any]) -> dict[str, Any]:
        """``spec_extra_bytes``: what the speculation read for nothing."""
        if c["spec_prefetch_bytes"]:
            return {"spec_extra_bytes": max(0, c["spec_prefetch_bytes"] - c["spec_used_bytes"])}
        return {}

    def stop(self) -> None:
        if self.spec is not None:
            self.spec.wait()
        for req, _ in self.sends:
            self.src._poll(req)
        self.sends.clear()

    def close(self) -> None:
        if self.spec is not None:
            self.spec.close()
            self.spec = None
        if self.comm is not None:
            mpi.free(self.comm)
            self.comm = None

    @classmethod
    def memory(cls, plan, unit: int) -> int:
        """The two halves, and a reader's prefetch: its part and the margins."""
        return super().memory(plan, unit) + 2 * unit * int(plan.records.max_length)


# ---------------------------------------------------------------------- DIO
class DIO(_Mode):
    """LMDBIO-DIO: one process locates the records of the coming ⌈8192/B⌉ steps and
    broadcasts (sorted ids, offsets, lengths); the readers ``pread`` their extents."""

    name = "dio"

    def __init__(self, src: LmdbioSource) -> None:
        super().__init__(src)
        self.locator: Locator | None = None
        self.locator_rank = 0
        self.w_locate = 1  # steps located at a time
        self.located: tuple[np.ndarray, ...] = (np.zeros(0, np.int64),) * 3

    def open(self, plan) -> None:
        self.src._engine_for(_method(plan.strategy.read))

    def setup(self, plan) -> BaseException | None:
        try:
            self._setup(plan)
        except Exception as e:
            return e
        return None

    def _setup(self, plan) -> None:
        src = self.src
        if src.aggregated:
            self.locator_rank = plan.readers[0]
        else:  # rank 0 locates for everyone; without MPI to share it, every rank itself
            self.locator_rank = 0 if src.world is not None else src.ctx.rank
        self.w_locate = max(1, -(-_LOCATE_RECORDS // plan.batch_size))
        self.located = (np.zeros(0, np.int64),) * 3
        if src.ctx.rank == self.locator_rank and self.locator is None:
            self.locator = Locator(src._path, src.c)

    def get(self, step: int) -> RawBatch:
        self._maybe_locate(step)
        return super().get(step)

    def _maybe_locate(self, step: int) -> None:
        """Every ``w_locate`` steps: the locator's extents for them, on every rank."""
        src = self.src
        if (step - src.first) % self.w_locate:
            return
        plan = src.plan
        last = min(step + self.w_locate, plan.num_steps)
        payload: Any = None
        if self.locator is not None:
            try:
                pos = np.arange(step * plan.batch_size, min(last * plan.batch_size, plan.total))
                payload = self.locator.locate(plan.ids_at(pos))
            except BaseException as e:
                payload = _Failed(e)
        if src.world is not None and src.world.size > 1:
            t0 = time.perf_counter()
            payload = src.world.bcast(payload, root=self.locator_rank, stop=src._stop_evt)
            if src.ctx.rank != self.locator_rank:
                src._wait_add("locate_wait_s", t0)
        if isinstance(payload, _Failed):
            raise payload.exc
        self.located = payload

    def read_part(self, step: int, ids: np.ndarray, dest: np.ndarray) -> np.ndarray:
        src = self.src
        u, offs, lens = self.located
        i = np.searchsorted(u, ids)
        if len(ids) and (len(u) == 0 or not np.array_equal(u[np.minimum(i, len(u) - 1)], ids)):
            raise FeedlineError(f"step {step}: records missing from the located extents")
        read_extents(src._engine_for(src.plan.strategy.read), offs[i], lens[i], dest, src.c)
        return lens[i].copy()

    def close(self) -> None:
        if self.locator is not None:
            self.locator.close()
            self.locator = None


# -------------------------------------------------------------------- index
class Index(_Mode):
    """The seeking presets on a dataset that is not an LMDB (no tree to walk): the same
    readers and order, extents from the index, read with the strategy's method."""

    name = "index"

    def open(self, plan) -> None:
        self.src._engine_for(plan.strategy.read)

    def read_part(self, step: int, ids: np.ndarray, dest: np.ndarray) -> np.ndarray:
        src = self.src
        fid, off, ln = src.plan.records.extents(ids)
        read_extents(src._engine_for(src.plan.strategy.read), off, ln, dest, src.c, fid)
        return ln


# ------------------------------------------------------- PROV / COAL / STAG
class Prov(_Mode):
    """LMDBIO-PROV, -COAL and -STAG: the planner's read windows (one step each for PROV,
    coalesced for COAL), extents from provenance; the buffer holds a window per half,
    the node meets once per window, and with staggering a reader reads only while it
    holds its token."""

    name = "prov"

    def __init__(self, src: LmdbioSource) -> None:
        super().__init__(src)
        self.steps: list[range] = []  # the windows' steps
        self.ops: list[list[Any]] = []  # per window, every reader's read operation
        self.win = -1  # the window in the buffer (-1: none yet)
        self.cur: dict[str, Any] = {}  # this rank's samples in it (node.window_layout)

    def open(self, plan) -> None:
        self.src._engine_for(_method(plan.strategy.read))

    def setup(self, plan) -> BaseException | None:
        from ..plan.reads import unit_of, window_ops, windows

        src = self.src
        st = plan.strategy
        asked = src.ctx.extra.get("knobs", {}).get("stagger")
        n = (
            int(asked)
            if asked is not None
            else (max(1, len(plan.readers) // 2) if st.stagger else 0)
        )
        if n:
            plan = dataclasses.replace(plan, strategy=st.replace(stagger=n))
            src.plan = plan
            src._stagger_n = n
        self.steps = windows(plan)
        unit, readers = (
            unit_of(plan, src.readers[0]) if src.aggregated else (src.ctx.rank, [src.ctx.rank])
        )
        self.ops = [window_ops(plan, unit, readers, r, s) for r, s in enumerate(self.steps)]
        self.win = -1
        return None

    def half_bytes(self) -> int:
        """The largest window's reads of the unit."""
        return max((sum(o.nbytes for o in ops) for ops in self.ops), default=0)

    def ready(self) -> None:
        """A reader's staggering token (with more than one reader under MPI)."""
        src = self.src
        plan = src.plan  # with the stagger knob setup put in
        if src.is_reader and src._stagger_n and src.world is not None and len(plan.readers) > 1:
            src._token = src.world.token(plan.stagger(src.ctx.rank))
            src._token.stop = src._stop_evt

    def get(self, step: int) -> RawBatch:
        while self.win < 0 or step >= self.steps[self.win].stop:
            self._next_window(self.win + 1)
        cur = self.cur
        i = step - cur["steps"].start
        a, b = int(cur["bounds"][i]), int(cur["bounds"][i + 1])
        if a == b:
            return RawBatch.empty()
        half = self.src._buf[self.win % 2]
        return RawBatch(
            cur["ids"][a:b], gather(half, cur["src"][a:b], cur["size"][a:b]), cur["size"][a:b]
        )

    def _next_window(self, r: int) -> None:
        """Read window *r* into its half (this reader's operation), meet the node."""
        src = self.src
        ops = self.ops[r]
        failure = None
        if src.is_reader:
            op = ops[src.j]
            base = sum(o.nbytes for o in ops[: src.j])
            dest = np.zeros(len(op.lengths), dtype=np.int64)
            if len(op.lengths) > 1:
                np.cumsum(op.lengths[:-1], out=dest[1:])
            view = src._buf[r % 2, base : base + op.nbytes]
            engine = src._engine_for(src.plan.strategy.read)
            token = src._token
            try:
                if token is not None:
                    t0 = time.perf_counter()
                    token.acquire()
                    src._wait_add("token_wait_s", t0)
                try:
                    t0 = time.perf_counter()
                    engine.read(ReadList(op.file_ids, op.offsets, op.lengths, dest), view)
                    src.c["io_s"] += time.perf_counter() - t0
                    src.c["records_read"] += len(op.ids)
                    src.c["payload_read_bytes"] += op.payload
                finally:
                    if token is not None:
                        token.release()  # passed on even after a failed read
                if token is not None and r == len(self.ops) - 1:
                    t0 = time.perf_counter()
                    token.close()  # the ring's last token comes home
                    src._wait_add("token_wait_s", t0)
            except BaseException as e:
                if not src.aggregated:
                    raise
                failure = _Failed(e)
        if src.aggregated:
            src._meet(failure)
        self._index_window(r)

    def _index_window(self, r: int) -> None:
        """This rank's samples in window r: (step, slot) order and byte positions."""
        from .node_plan import window_layout

        src = self.src
        first = src.node_ranks.start if src.aggregated else src.ctx.rank
        self.cur = window_layout(src.plan, self.ops[r], self.steps[r], src.ctx.rank, first)
        self.win = r

    @classmethod
    def memory(cls, plan, unit: int) -> int:
        """The two halves of the largest window (its samples at the longest, as
        :func:`~feedline.plan.reads.window_steps` counts them)."""
        from ..plan.reads import window_steps, window_top

        return 2 * window_top(plan)(window_steps(plan) * unit)


#: mode name -> class
MODES: dict[str, type[_Mode]] = {m.name: m for m in (Cursor, DM, DIO, Index, Prov)}
