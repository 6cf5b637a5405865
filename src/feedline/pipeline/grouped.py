"""``grouped``: the asynchronous-I/O paper's I/O-dedicated thread with one or two buffers.

The plan's ``chunk`` assignment gives each rank runs of samples that belong to one
group of g contiguous records (locally shuffled). An I/O thread reads one whole group
per read into a free buffer (a group spanning two files takes two reads); the consumer
copies its sub-batch out of the current buffer and releases it when drained. With one
buffer (``async``) the read of the next group starts only when the consumer has drained
the current one, so reads never overlap compute; with two (``async-db``) the I/O thread
fills one buffer while the consumer drains the other. The trade: B samples (one or two
buffers' worth) of memory per rank for one large read per group.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from .reader import ExtentReader, coalesce, gather
from .source import RawBatch, Source, SourceContext, SourceStopped, register_source

_WHOLE = 1 << 62  # merge every extent of a group: one read per group and file


class GroupBufferSource(Source):
    """Reads whole groups into ``strategy.prefetch_depth`` buffers on an I/O thread."""

    name = "grouped"
    threaded = True

    def __init__(self, ctx: SourceContext) -> None:
        super().__init__(ctx)
        self._reader: ExtentReader | None = None
        self._thread: threading.Thread | None = None
        self._cond = threading.Condition()
        self._stop = False
        self._peak_group = 0
        self._fills = 0
        self._wait_s = 0.0

    # ---------------------------------------------------------------- setup
    def start(self, plan, first_step: int) -> None:
        self.stop()
        if self._reader is None:
            self._reader = ExtentReader(self.ctx.dataset.files, 1, plan.strategy.read)
        ids, offsets = plan.rank_samples(self.ctx.rank)
        self._plan = plan
        self._first = first_step
        self._ids = ids
        self._offsets = offsets
        g = _group_size(plan)
        # runs of consecutive positions whose samples share a group: one buffer fill each
        grp = ids // g
        cut = np.flatnonzero(grp[1:] != grp[:-1]) + 1 if len(ids) else np.zeros(0, dtype=np.int64)
        self._run_lo = np.concatenate(([0], cut)).astype(np.int64) if len(ids) else cut
        self._run_hi = np.concatenate((cut, [len(ids)])).astype(np.int64) if len(ids) else cut
        self._nbuf = max(1, int(plan.strategy.prefetch_depth) or 1)
        self._ready: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._free = self._nbuf
        self._error: BaseException | None = None
        self._stop = False
        self._cur = 0  # run the consumer is in
        if len(self._run_lo):
            self._thread = threading.Thread(
                target=self._io_loop, name=f"feedline-io-r{self.ctx.rank}", daemon=True
            )
            self._thread.start()

    # ------------------------------------------------------------ I/O thread
    def _io_loop(self) -> None:
        plan, reader = self._plan, self._reader
        assert reader is not None
        try:
            for k in range(len(self._run_lo)):
                with self._cond:
                    while self._free == 0 and not self._stop:
                        self._cond.wait(0.05)
                    if self._stop:
                        return
                    self._free -= 1
                run = self._ids[self._run_lo[k] : self._run_hi[k]]
                fid, off, ln = plan.records.extents(run)
                c = coalesce(fid, off, ln, gap=_WHOLE)
                buf = np.empty(c.buffer_bytes, dtype=np.uint8)
                reader.read(c.reads, buf)
                with self._cond:
                    self._ready[k] = (buf, c.src, ln)
                    self._fills += 1
                    self._peak_group = max(self._peak_group, c.buffer_bytes)
                    self._cond.notify_all()
        except BaseException as e:  # surfaces in the consumer as the original error
            with self._cond:
                self._error = e
                self._cond.notify_all()

    # -------------------------------------------------------------- consumer
    def _wait(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        with self._cond:
            t0 = time.perf_counter()
            while k not in self._ready:
                if self._error is not None:
                    raise self._error
                if self._stop:
                    raise SourceStopped()
                self._cond.wait(0.05)
            self._wait_s += time.perf_counter() - t0
            return self._ready[k]

    def _release(self, k: int) -> None:
        with self._cond:
            self._ready.pop(k, None)
            self._free += 1
            self._cond.notify_all()

    def get(self, step: int) -> RawBatch:
        i = step - self._first
        lo, hi = int(self._offsets[i]), int(self._offsets[i + 1])
        if lo == hi:
            return RawBatch.empty()
        ids = self._ids[lo:hi]
        parts: list[np.ndarray] = []
        lens: list[np.ndarray] = []
        pos = lo
        while pos < hi:
            k = self._cur
            rlo, rhi = int(self._run_lo[k]), int(self._run_hi[k])
            buf, src, ln = self._wait(k)
            a, b = pos - rlo, min(hi, rhi) - rlo
            parts.append(gather(buf, src[a:b], ln[a:b]))
            lens.append(ln[a:b])
            pos = rlo + b
            if pos == rhi:  # buffer drained: hand it back to the I/O thread
                self._release(k)
                self._cur += 1
        data = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return RawBatch(ids, data, np.concatenate(lens).astype(np.int64))

    # ------------------------------------------------------------- lifecycle
    def request_stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()

    def stop(self) -> None:
        t = self._thread
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if t is not None:
            t.join()
        self._thread = None
        self._ready = {}

    def memory_bytes(self, plan) -> int:
        g = _group_size(plan)
        nbuf = max(1, int(plan.strategy.prefetch_depth) or 1)
        return nbuf * g * int(plan.records.max_length)

    def stats(self) -> dict[str, Any]:
        st = self._reader.stats() if self._reader is not None else {}
        nbuf = getattr(self, "_nbuf", 1)
        st.update(
            buffer_bytes=nbuf * self._peak_group,
            buffers=nbuf,
            group_reads=self._fills,
            buffer_wait_s=self._wait_s,
        )
        return st

    def close(self) -> None:
        self.stop()
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def _group_size(plan) -> int:
    from ..plan.streams import get_assignment

    get_assignment("chunk")  # loads the assignment registry as a whole
    from ..plan.assign_chunk import chunk_size

    return chunk_size(plan.n, plan.strategy)


register_source(GroupBufferSource, presets=("async", "async-db"))
