# SPDX-License-Identifier: Apache-2.0
"""``grouped``: the asynchronous-I/O paper's I/O-dedicated thread with one or two buffers.

The plan's ``chunk`` assignment gives each rank runs of samples that belong to one
group of g contiguous records (locally shuffled). An I/O thread reads one whole group
per read into a free buffer (a group spanning two files takes two reads); the consumer
copies its sub-batch out of the current buffer and releases it when drained. With one
buffer (``async``) the read of the next group starts only when the consumer has drained
the current one, so reads never overlap compute; with two (``async-db``) the I/O thread
fills one buffer while the consumer drains the other. The trade: B samples (one or two
buffers' worth) of memory per rank for one large read per group.

Across epochs the I/O thread runs on: when every group of the pass is read, it makes
the plan the Loader expects next (``anticipate``: the next epoch from step 0) and goes
on filling buffers with that pass's groups as they free, so an epoch's first steps do
not wait for storage either. ``start`` adopts that speculative pass, reads and thread
included, only if it delivers exactly the samples the new pass asks for (same ids in
the same order from the same step); otherwise it is cancelled and dropped (a
``set_epoch`` to another epoch, a resume mid-epoch, a new seed). Errors met while
reading ahead surface only if the pass is adopted and reaches the failed group.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from ..pipeline.reader import ExtentReader, coalesce, gather
from .base import RawBatch, Source, SourceContext, SourceStopped, register_source

_WHOLE = 1 << 62  # merge every extent of a group: one read per group and file
_POLL = 0.05  # seconds between checks of the stop flag while blocked

Group = tuple[np.ndarray, np.ndarray, np.ndarray]  # buffer, sample offsets, lengths


class _Pass:
    """One rank's groups of one pass: what to read (runs) and what was read (ready)."""

    def __init__(self, plan, first: int, rank: int) -> None:
        self.plan = plan
        self.first = first
        self.ids, self.offsets = plan.rank_samples(rank)
        self.g = _group_size(plan)
        self.run_lo, self.run_hi = _runs(self.ids, self.g)
        self.ready: dict[int, Group] = {}
        self.next_read = 0  # next run the I/O thread reads
        self.cur = 0  # run the consumer is in
        self.error: BaseException | None = None

    def same_samples(self, other: _Pass) -> bool:
        return (
            self.first == other.first
            and self.g == other.g
            and np.array_equal(self.offsets, other.offsets)
            and np.array_equal(self.ids, other.ids)
        )

    def run(self, k: int) -> np.ndarray:
        return self.ids[self.run_lo[k] : self.run_hi[k]]


class GroupBufferSource(Source):
    """Reads whole groups into ``strategy.prefetch_depth`` buffers on an I/O thread."""

    name = "grouped"
    threaded = True

    def __init__(self, ctx: SourceContext) -> None:
        super().__init__(ctx)
        self._reader: ExtentReader | None = None
        self._thread: threading.Thread | None = None
        self._running = False  # an I/O thread is alive (guarded by _cond)
        self._cond = threading.Condition()
        self._stop = False
        self._pass: _Pass | None = None  # what the consumer reads
        self._spec: _Pass | None = None  # read ahead for the pass expected next
        self._next_plan = None
        self._finished = False
        self._nbuf = 1
        self._free = 0  # buffers the I/O thread may fill (pooled in _pool or not yet made)
        self._pool: list[np.ndarray] = []  # released buffers, reused (no allocation churn)
        self._spans: dict[tuple[int, int, int], int] = {}
        self._span = 0  # bytes of each buffer: the widest group's reads
        self._peak_group = 0
        self._fills = 0
        self._anticipated = 0
        self._carried = 0
        self._adopted = 0
        self._wait_s = 0.0

    # ---------------------------------------------------------------- setup
    def start(self, plan, first_step: int) -> None:
        if self._reader is None:
            self._reader = ExtentReader(
                self.ctx.dataset.files, 1, plan.strategy.read, timeout_s=self.ctx.options.timeout_s
            )
        new = _Pass(plan, first_step, self.ctx.rank)
        with self._cond:
            if self._finished:  # the I/O thread may still be making the expected plan
                while self._running and self._spec is None and not self._stop:
                    self._cond.wait(_POLL)
            spec = self._spec
            adopt = self._finished and not self._stop and spec is not None
            adopt = adopt and spec.same_samples(new)  # type: ignore[union-attr]
            if adopt:  # the I/O thread already reads this pass: keep it going
                self._pass, self._spec = spec, None
                self._carried += len(spec.ready)  # type: ignore[union-attr]
                self._adopted += 1
                self._finished = False
                self._next_plan = None
        if not adopt:
            self.stop()
            self._nbuf = max(1, int(plan.strategy.prefetch_depth) or 1)
            self._free = self._nbuf
            self._span = self.memory_bytes(plan) // self._nbuf
            self._pool = [b for b in self._pool[: self._nbuf] if b.nbytes >= self._span]
            self._stop = False
            self._pass = new
        self._ensure_thread()

    def anticipate(self, next_plan) -> None:
        with self._cond:
            self._next_plan = next_plan
        self._ensure_thread()

    def _ensure_thread(self) -> None:
        with self._cond:
            if self._running or self._stop or self._pass is None:
                return
            self._running = True
        t = self._thread
        if t is not None:
            t.join()  # it has left its loop (it cleared _running under the lock)
        self._thread = threading.Thread(
            target=self._io_loop, name=f"feedline-io-r{self.ctx.rank}", daemon=True
        )
        self._thread.start()

    # ------------------------------------------------------------ I/O thread
    def _take_buffer(self) -> np.ndarray | None:
        """A free buffer (pooled, or a new empty one), or None when stopped."""
        with self._cond:
            while self._free == 0 and not self._stop:
                self._cond.wait(_POLL)
            if self._stop:
                return None
            self._free -= 1
            # buffers are made once, as large as the widest group (no growth, no churn)
            return self._pool.pop() if self._pool else np.empty(self._span, dtype=np.uint8)

    def _give_back(self, buf: np.ndarray) -> None:
        """Return a buffer to the pool (caller holds the lock)."""
        self._free += 1
        if len(self._pool) < self._nbuf:
            self._pool.append(buf)

    def _read_run(self, p: _Pass, k: int, buf: np.ndarray) -> Group:
        assert self._reader is not None
        fid, off, ln = p.plan.records.extents(p.run(k))
        c = coalesce(fid, off, ln, gap=_WHOLE)
        if buf.nbytes < c.buffer_bytes:  # pragma: no cover - group_span bounds every run
            raise RuntimeError(f"group of {c.buffer_bytes} bytes exceeds its {buf.nbytes}")
        self._reader.read(c.reads, buf)
        return buf, c.src, ln

    def _fill(self, p: _Pass, speculative: bool) -> bool:
        """Read *p*'s remaining groups as buffers free; False when stopped or failed."""
        while p.next_read < len(p.run_lo):
            buf = self._take_buffer()
            if buf is None:
                return False
            k = p.next_read
            try:
                got = self._read_run(p, k, buf)
            except BaseException as e:  # surfaces in the consumer as the original error
                with self._cond:
                    self._give_back(buf)
                    p.error = e
                    self._cond.notify_all()
                return False
            with self._cond:
                p.ready[k] = got
                p.next_read = k + 1
                self._fills += 1
                self._anticipated += speculative
                self._peak_group = max(self._peak_group, got[0].nbytes)
                del buf, got
                self._cond.notify_all()
        return True

    def _io_loop(self) -> None:
        try:
            with self._cond:
                p = self._pass
            speculative = False
            while p is not None and self._fill(p, speculative):
                with self._cond:  # the pass is read: go on with the one expected next
                    make, self._next_plan = self._next_plan, None
                    if make is None or self._stop:
                        return
                try:
                    nxt = _Pass(make(), 0, self.ctx.rank)
                except Exception:  # speculative: no pass read ahead, nothing lost
                    return
                with self._cond:
                    if self._stop:
                        return
                    self._spec = nxt
                    self._cond.notify_all()
                p, speculative = nxt, True
        finally:
            with self._cond:
                self._running = False
                self._cond.notify_all()

    # -------------------------------------------------------------- consumer
    def _wait(self, p: _Pass, k: int) -> Group:
        with self._cond:
            t0 = time.perf_counter()
            while k not in p.ready:
                if p.error is not None:
                    raise p.error
                if self._stop:
                    raise SourceStopped()
                if not self._running:  # nobody will read it: a bug, never a hang
                    raise RuntimeError(f"grouped source: group {k} was never read")
                self._cond.wait(_POLL)
            self._wait_s += time.perf_counter() - t0
            return p.ready[k]

    def _release(self, p: _Pass, k: int) -> None:
        with self._cond:
            group = p.ready.pop(k, None)
            if group is not None:
                self._give_back(group[0])
            else:
                self._free += 1
            self._cond.notify_all()

    def get(self, step: int) -> RawBatch:
        p = self._pass
        assert p is not None
        i = step - p.first
        lo, hi = int(p.offsets[i]), int(p.offsets[i + 1])
        if lo == hi:
            return RawBatch.empty()
        ids = p.ids[lo:hi]
        parts: list[np.ndarray] = []
        lens: list[np.ndarray] = []
        pos = lo
        while pos < hi:
            k = p.cur
            rlo, rhi = int(p.run_lo[k]), int(p.run_hi[k])
            buf, src, ln = self._wait(p, k)
            a, b = pos - rlo, min(hi, rhi) - rlo
            parts.append(gather(buf, src[a:b], ln[a:b]))
            lens.append(ln[a:b])
            pos = rlo + b
            if pos == rhi:  # buffer drained: hand it back to the I/O thread
                del buf, src, ln  # no reference of ours outlives the release
                self._release(p, k)
                p.cur += 1
        data = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return RawBatch(ids, data, np.concatenate(lens).astype(np.int64))

    # ------------------------------------------------------------- lifecycle
    def request_stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()

    def finish(self) -> None:
        # every group was consumed: the I/O thread goes on with the anticipated pass
        # (the next start adopts or cancels it; stop and close cancel it)
        with self._cond:
            self._finished = True

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        t = self._thread
        if t is not None:
            t.join()
        self._thread = None
        with self._cond:
            self._running = False
            self._pass = self._spec = None
            self._next_plan = None
            self._finished = False
            self._free = self._nbuf

    def memory_bytes(self, plan) -> int:
        """``prefetch_depth`` buffers, each as large as the widest group's reads (a group's
        extents are read whole, holes included: page headers and keys in LMDB, framing
        in TFRecord), not g x the longest record (issue 16: async-db ran 46 % over)."""
        g = _group_size(plan)
        nbuf = max(1, int(plan.strategy.prefetch_depth) or 1)
        key = (id(plan.records), plan.n, g)
        if key not in self._spans:
            self._spans = {key: group_span(plan.records, plan.n, g)}
        return nbuf * self._spans[key]

    def stats(self) -> dict[str, Any]:
        st = self._reader.stats() if self._reader is not None else {}
        st.update(
            buffer_bytes=self._nbuf * self._peak_group,
            buffers=self._nbuf,
            group_reads=self._fills,
            anticipated_groups=self._anticipated,
            carried_groups=self._carried,
            adopted_passes=self._adopted,
            buffer_wait_s=self._wait_s,
        )
        return st

    def close(self) -> None:
        self.stop()
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def _runs(ids: np.ndarray, g: int) -> tuple[np.ndarray, np.ndarray]:
    """Runs of consecutive positions whose samples share a group: one buffer fill each."""
    if not len(ids):
        z = np.zeros(0, dtype=np.int64)
        return z, z
    grp = ids // g
    cut = np.flatnonzero(grp[1:] != grp[:-1]) + 1
    lo = np.concatenate(([0], cut)).astype(np.int64)
    hi = np.concatenate((cut, [len(ids)])).astype(np.int64)
    return lo, hi


def group_span(records, n: int, g: int, block: int = 1 << 20) -> int:
    """The most bytes one group of *g* consecutive records occupies when each of its
    files' extents is read as one run (what :meth:`GroupBufferSource._read_run` reads)."""
    if n == 0:
        return 0
    block = max(g, block // g * g)
    worst = 0
    for lo in range(0, n, block):
        ids = np.arange(lo, min(n, lo + block), dtype=np.int64)
        fid, off, ln = records.extents(ids)
        grp = ids // g
        order = np.lexsort((fid, grp))
        grp, fid, off, end = grp[order], fid[order], off[order], (off + ln)[order]
        cut = np.flatnonzero((grp[1:] != grp[:-1]) | (fid[1:] != fid[:-1])) + 1
        starts = np.concatenate(([0], cut))
        span = np.maximum.reduceat(end, starts) - np.minimum.reduceat(off, starts)
        per_group = np.bincount(grp[starts] - grp[0], weights=span)
        worst = max(worst, int(per_group.max()))
    return worst


def _group_size(plan) -> int:
    from ..plan.streams import get_assignment

    get_assignment("chunk")  # loads the assignment registry as a whole
    from ..plan.rl import chunk_size

    return chunk_size(plan.n, plan.strategy)


register_source(GroupBufferSource, presets=("async", "async-db"))
