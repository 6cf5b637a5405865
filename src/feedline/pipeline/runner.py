"""One pass over an epoch's steps: the producer thread, decode workers and read-ahead.

With read-ahead depth d >= 1 a producer thread asks the source for step after step and
hands each raw batch to a pool of worker threads that decode it and run ``transform``;
at most d batches are in flight counting the one the consumer holds (d = 2 is double
buffering: one batch consumed, the next being read). With d = 0, or when the source
runs its own I/O thread and buffers, the consumer reads and decodes inline. The
consumer's time spent waiting in ``next`` is the *exposed I/O time*.

Errors raised by the source or the workers reach the consumer as the original
exception object (typed: StorageError, CorruptDataError, ...), never as a hang; ``close``
stops the source, wakes and joins every thread, and may be called from any state.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..errors import FeedlineError
from .source import RawBatch, Source, SourceStopped

_POLL = 0.05  # seconds between checks of the stop flag while blocked
_END = object()


class EpochRun:
    """Delivers ``assemble(source.get(s), s)`` for s in ``[first, last)`` in order.

    Parameters
    ----------
    source : Source
        Already started for this epoch.
    first, last : int
        Steps to deliver.
    assemble : callable
        ``(RawBatch, step) -> batch``: decoding and transform (runs in workers).
    depth : int
        Read-ahead depth d (0: inline in the consumer).
    workers : int
        Decode/transform threads.
    timeout_s : float
        Longest wait for one batch (0: no limit).
    """

    def __init__(
        self,
        source: Source,
        first: int,
        last: int,
        assemble: Callable[[RawBatch, int], Any],
        *,
        depth: int,
        workers: int,
        timeout_s: float = 0.0,
        name: str = "feedline",
    ) -> None:
        self.source = source
        self.next_step = first
        self.last = last
        self.assemble = assemble
        self.timeout_s = timeout_s
        self.exposed_s = 0.0
        self.delivered = 0
        self._closed = False
        self._stop = threading.Event()
        self._inline = depth == 0 or source.threaded
        self._holding = False
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        if not self._inline and first < last:
            self._slots = threading.Semaphore(depth)
            self._queue: queue.Queue = queue.Queue()
            self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"{name}-work")
            self._thread = threading.Thread(target=self._produce, name=f"{name}-read", daemon=True)
            self._thread.start()

    # -------------------------------------------------------------- producer
    def _acquire_slot(self) -> bool:
        while not self._stop.is_set():
            if self._slots.acquire(timeout=_POLL):
                return True
        return False

    def _produce(self) -> None:
        step = self.next_step
        try:
            while step < self.last:
                if not self._acquire_slot():
                    return
                raw = self.source.get(step)
                if self._stop.is_set():
                    return
                assert self._pool is not None
                self._queue.put(self._pool.submit(self.assemble, raw, step))
                step += 1
            self._queue.put(_END)
        except SourceStopped:
            return
        except BaseException as e:  # delivered to the consumer in order
            f: Future = Future()
            f.set_exception(e)
            self._queue.put(f)

    # -------------------------------------------------------------- consumer
    def __iter__(self) -> EpochRun:
        return self

    def __next__(self) -> Any:
        if self._closed or self.next_step >= self.last:
            self.close()
            raise StopIteration
        t0 = time.perf_counter()
        try:
            if self._inline:
                raw = self.source.get(self.next_step)
                batch = self.assemble(raw, self.next_step)
            else:
                batch = self._next_threaded(t0)
        except BaseException:
            self.exposed_s += time.perf_counter() - t0
            self.close()
            raise
        self.exposed_s += time.perf_counter() - t0
        self.next_step += 1
        self.delivered += 1
        return batch

    def _next_threaded(self, t0: float) -> Any:
        if self._holding:  # the consumer is done with the previous batch: free its slot
            self._slots.release()
            self._holding = False
        while True:
            try:
                item = self._queue.get(timeout=_POLL)
                break
            except queue.Empty:
                if self.timeout_s and time.perf_counter() - t0 > self.timeout_s:
                    raise FeedlineError(
                        f"no batch for step {self.next_step} within {self.timeout_s:g} s "
                        "(storage stalled?); raise timeout_s= or check the file system"
                    ) from None
                if self._thread is not None and not self._thread.is_alive() and self._queue.empty():
                    raise FeedlineError(
                        "the loader's reader thread ended without a batch"
                    ) from None
        if item is _END:
            raise StopIteration
        batch = item.result()
        self._holding = True
        return batch

    # -------------------------------------------------------------- shutdown
    def close(self) -> None:
        """Stop reading, wake and join all threads; idempotent, callable from any thread."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        try:
            self.source.request_stop()  # wakes a get() blocked in the producer
            if self._thread is not None:
                self._thread.join()
                self._thread = None
        finally:
            try:
                self.source.stop()
            finally:
                if self._pool is not None:
                    self._pool.shutdown(wait=True, cancel_futures=True)
                    self._pool = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
