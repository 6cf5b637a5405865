# SPDX-License-Identifier: Apache-2.0
"""``direct``: each rank executes its own read operations from the plan with the engine.

The plan (``feedline.plan.reads``) cuts the epoch into windows of w steps and gives
each rank one operation per window: extents sorted by location and merged across small
holes (w = 1 without coalescing; with ``coalesce_bytes`` w grows until reads reach that
size under the memory cap). This source reads a window into one buffer and cuts each
step's sub-batch out of it in delivery order. With coalescing and read-ahead it starts
reading the next window while the current one is consumed (two live windows, as the
planner sized them). While the last window of a pass is consumed, it reads the windows
of the first w steps of the pass the Loader expects next (``anticipate``: the next epoch
from step 0), at most one full window of bytes (the read-ahead's own room); the next
``start`` adopts them as long as its reads are the same, and drops the rest. With
``sample_reads`` every record is its own read: ``tf`` reads them one at a time in the
caller, ``tf-pre`` on a pool of threads like tf.data's AUTOTUNE, ahead of the consumer.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import deque
from typing import Any

import numpy as np

from ..io.engine import aligned_empty
from ..pipeline.reader import (
    DIRECT_BLOCK,
    ExtentReader,
    ReadList,
    direct_align,
    gather,
)
from .base import RawBatch, Source, SourceContext, register_source


class _Window:
    """One read operation in flight or loaded, indexed by step."""

    __slots__ = ("base", "buf", "future", "ids", "lo", "op", "size", "src", "steps")

    def __init__(self, op, reader: ExtentReader, base: np.ndarray) -> None:
        self.op = op
        self.steps = op.steps
        order = np.lexsort((op.slot, op.step))
        self.ids = op.ids[order]
        self.src = op.src[order]
        self.size = op.size[order]
        st = op.step[order]
        self.lo = np.searchsorted(st, np.arange(op.steps.start, op.steps.stop + 1))
        self.base = base  # a buffer of the source's pool, at least op.buffer_bytes long
        self.buf = base[: op.buffer_bytes]
        reads = ReadList(op.file_ids, op.offsets, op.lengths, op.placement())
        self.future = reader.submit(reads, self.buf)

    def take(self, step: int) -> RawBatch:
        i = step - self.steps.start
        a, b = int(self.lo[i]), int(self.lo[i + 1])
        if a == b:
            return RawBatch.empty()
        self.future.result()
        data = gather(self.buf, self.src[a:b], self.size[a:b])
        return RawBatch(self.ids[a:b], data, self.size[a:b])


def _same_op(a, b) -> bool:
    """Whether two read operations read the same extents into the same places."""
    if a.steps != b.steps:
        return False
    names = ("file_ids", "offsets", "lengths", "ids", "step", "slot", "src", "size")
    return all(np.array_equal(getattr(a, k), getattr(b, k)) for k in names)


class DirectSource(Source):
    """Every rank reads the extents of its own samples (no aggregation)."""

    name = "direct"

    def __init__(self, ctx: SourceContext) -> None:
        super().__init__(ctx)
        self._reader: ExtentReader | None = None
        self._threads = 0
        self._live: deque[_Window] = deque()
        self._ops: Any = iter(())
        self._ahead = 0
        self._peak_buffer = 0
        self._windows = 0
        # the buffers of consumed windows, reused by the next ones: a fresh buffer per
        # window would fault in (and zero) every byte of the epoch once more
        self._spare: list[np.ndarray] = []
        self._next_plan: Any = None  # the plan expected after this pass (anticipate)
        self._spec: list[_Window] = []  # its first windows, read ahead
        self._anticipated = 0  # windows read ahead and adopted
        self._exhausted = False  # every read operation of the pass was pulled
        self._align: tuple[int, Any] = (0, None)  # (direct-I/O block, file sizes) or 0
        self._room = 0  # bytes of a new window buffer (the pass's widest window)

    def _threads_for(self, plan) -> int:
        st = plan.strategy
        if st.sample_reads:
            # TF: one sample per read; without prefetch tf.data reads in the caller,
            # one at a time; with prefetch a thread pool sized like AUTOTUNE
            return 1 if st.prefetch_depth == 0 else self.ctx.options.sample_threads
        return self.ctx.options.io_threads

    def start(self, plan, first_step: int) -> None:
        from ..plan.reads import iter_reads, window_steps

        spec, self._spec = self._spec, []
        self.stop()
        self._next_plan = None
        threads = self._threads_for(plan)
        if self._reader is None or threads != self._threads:
            for win in spec:  # read by the reader about to close
                self._drop(win)
            spec = []
            if self._reader is not None:
                self._reader.close()
            self._reader = ExtentReader(
                self.ctx.dataset.files,
                threads,
                plan.strategy.read,
                timeout_s=self.ctx.options.timeout_s,
            )
            self._threads = threads
        self._plan = plan
        self._align = direct_align(self.ctx.dataset.files, plan.strategy.read, self._align[1])
        self._ops = self._aligned(iter_reads(plan, self.ctx.rank))
        self._exhausted = False
        w = window_steps(plan)
        # read the next window while this one is consumed only when windows span several
        # steps; per-step read-ahead is the Loader's prefetch queue
        self._ahead = 1 if (w > 1 and plan.strategy.prefetch_depth >= 2) else 0
        self._room = self.memory_bytes(plan) // (1 + self._ahead)  # one window at most
        if spec and first_step == 0:
            ops = self._aligned(iter_reads(plan, self.ctx.rank))
            while spec:
                op = next(ops, None)
                if op is None or not _same_op(op, spec[0].op):
                    break
                self._live.append(spec.pop(0))  # read (or being read): adopt it
                self._anticipated += 1
            if not spec:
                self._ops = ops
            elif self._live:  # adopted some: the next op is the one that differed
                self._ops = itertools.chain([op] if op is not None else [], ops)
        for win in spec:
            self._drop(win)

    def anticipate(self, next_plan) -> None:
        self._next_plan = next_plan

    def _aligned(self, ops):
        """The read operations, widened to the direct-I/O blocks when reads are
        ``odirect`` (:func:`feedline.plan.reads.align_op`: no bounce copy)."""
        from ..plan.reads import align_op

        align, sizes = self._align
        for op in ops:
            yield align_op(op, align, sizes) if align else op

    def _speculate(self) -> None:
        """The pass's reads are all submitted: start reading the first windows of the
        pass expected next (best effort: any error only means nothing read ahead)."""
        make, self._next_plan = self._next_plan, None
        if make is None or self._reader is None:
            return
        from ..plan.reads import iter_reads, window_steps

        try:
            nxt = make()
            steps = window_steps(nxt)
            # the read-ahead's room: a full window (the widest buffer of this pass)
            room = max([b.nbytes for b in self._spare] + [x.base.nbytes for x in self._live])
            ops = []
            for op in self._aligned(iter_reads(nxt, self.ctx.rank)):
                if op.steps.start >= steps or op.buffer_bytes > room:
                    break  # the first w steps, in the room of one window
                room -= op.buffer_bytes
                ops.append(op)
            # one buffer for them all (a spare one when it fits): one window of memory
            big = self._buffer(sum(op.buffer_bytes for op in ops)) if ops else None
            at = 0
            for op in ops:
                assert big is not None
                self._spec.append(_Window(op, self._reader, big[at : at + op.buffer_bytes]))
                at += op.buffer_bytes
        except Exception:
            return

    def _drop(self, win: _Window) -> None:
        """A window read ahead for nothing: wait for its reads, keep its buffer."""
        with contextlib.suppress(Exception):
            win.future.result()
            self._keep(win.base)

    def _pull(self) -> bool:
        op = next(self._ops, None)
        if op is None:
            self._exhausted = True
            return False
        assert self._reader is not None
        self._live.append(_Window(op, self._reader, self._buffer(op.buffer_bytes)))
        self._windows += 1
        self._peak_buffer = max(self._peak_buffer, sum(w.base.nbytes for w in self._live))
        return True

    def _buffer(self, nbytes: int) -> np.ndarray:
        """The smallest spare buffer of at least *nbytes*, or a new one as large as the
        pass's widest window: an epoch's first windows are cut finer (w/8, w/8, w/4, w/2),
        and buffers of their own sizes could not hold the later windows, whose new
        buffers the kernel would fault in and zero once more (a third more memory touched
        per epoch; pages a window never writes cost nothing)."""
        fits = [i for i, b in enumerate(self._spare) if b.nbytes >= nbytes]
        if fits:
            return self._spare.pop(min(fits, key=lambda i: self._spare[i].nbytes))
        return aligned_empty(max(nbytes, self._room))

    def _keep(self, buf: np.ndarray) -> None:
        """Keep *buf* for a later window, the largest first, so that the windows live,
        read ahead and kept are never more than the plan's live windows."""
        self._spare.append(buf)
        self._spare.sort(key=lambda b: -b.nbytes)
        room = 1 + self._ahead - len(self._live) - (1 if self._spec else 0)
        del self._spare[max(room, 0) :]

    def _release(self, win: _Window) -> None:
        """A consumed window: wait for its reads, keep its buffer for a later window."""
        win.future.result()
        self._keep(win.base)

    def get(self, step: int) -> RawBatch:
        while self._live and self._live[0].steps.stop <= step:
            self._release(self._live.popleft())  # consumed: its buffer is free again
        while not self._live or self._live[-1].steps.stop <= step:
            if not self._pull():
                raise IndexError(f"step {step} is beyond the plan's reads")
        while len(self._live) < 1 + self._ahead and self._pull():
            pass
        # the last window is live: once its reads are done (so as never to compete with
        # them), read the first windows of the pass expected next
        live = self._live
        last = self._exhausted and len(live) == 1 and self._ahead > 0
        if self._next_plan is not None and last and live[0].future.done():
            self._speculate()
        win = self._live[0]
        if step not in win.steps:  # pragma: no cover - windows are consecutive
            raise IndexError(f"step {step} not in window {win.steps}")
        return win.take(step)

    def finish(self) -> None:
        """Every step delivered: release the windows, keep those read ahead."""
        self._release_live()

    def stop(self) -> None:
        spec, self._spec = self._spec, []
        for win in spec:
            self._drop(win)
        self._release_live()

    def _release_live(self) -> None:
        while self._live:
            w = self._live.popleft()
            with contextlib.suppress(Exception):
                self._release(w)  # never reuse a buffer the engine still writes
        self._ops = iter(())

    def memory_bytes(self, plan) -> int:
        from ..plan.reads import align_slack, window_cap, window_steps, window_top

        w = window_steps(plan)
        ahead = 1 if (w > 1 and plan.strategy.prefetch_depth >= 2) else 0
        sub = -(-plan.batch_size // plan.world.size)
        payload = window_top(plan)(w * sub)  # the window's records at the longest
        # a window reads through holes only while it fits its share of the cap
        per_window = max(payload, min(window_cap(plan), 2 * payload)) if w > 1 else payload
        if plan.strategy.read == "odirect":  # windows widened to whole blocks
            per_window += align_slack(per_window, DIRECT_BLOCK)
        return (1 + ahead) * per_window

    def stats(self) -> dict[str, Any]:
        st = self._reader.stats() if self._reader is not None else {}
        st["buffer_bytes"] = self._peak_buffer
        st["read_windows"] = self._windows
        st["anticipated_windows"] = self._anticipated
        return st

    def close(self) -> None:
        self.stop()
        self._spare.clear()
        if self._reader is not None:
            self._reader.close()
            self._reader = None


register_source(DirectSource, presets=("tf", "tf-pre", "feedline"))
