# SPDX-License-Identifier: Apache-2.0
"""One pass over an epoch's steps: the producer thread, decode workers and read-ahead.

With read-ahead depth d >= 1 a producer thread asks the source for step after step and
hands each raw batch to a pool of worker threads that decode it and run ``transform``;
at most d batches are in flight counting the one the consumer holds (d = 2 is double
buffering: one batch consumed, the next being read). With d = 0 the consumer reads and
decodes inline; so it does with a source that runs its own I/O thread and buffers
(``threaded``) at d <= 1, where one buffer means no overlap by definition. A threaded
source at d >= 2 still gets the producer and workers: its sub-batches are cut out of
its buffers and decoded ahead, so that a ready batch costs the consumer a queue pop
(about 20 us) instead of a copy and a decode. The consumer's time spent waiting in
``next`` is the *exposed I/O time*.

A pass that delivered all its steps ends with ``source.finish()`` (the source may keep
reading the next epoch's first batch it was told to anticipate); a pass dropped early
ends with ``request_stop`` and ``stop`` (everything cancelled).

Errors raised by the source or the workers reach the consumer as the original
exception object (typed: StorageError, CorruptDataError, ...), never as a hang; ``close``
stops the source, wakes and joins every thread, and may be called from any state.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any

from ..dist.alarm import Interrupted
from ..errors import FeedlineError, StorageTimeoutError
from ..sources.base import RawBatch, Source

_POLL = 0.05  # seconds between checks of the stop flag while blocked
_GRACE_S = 1.0  # past timeout_s, how long the consumer waits for the reader's own error


def inline_run(source: Source | type[Source], depth: int) -> bool:
    """Whether the consumer reads and decodes itself (no producer thread)."""
    return depth == 0 or (source.threaded and depth <= 1)


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
    pool : ThreadPoolExecutor, optional
        Decode/transform workers (kept by the Loader across passes); without one, a
        pool of *workers* threads is made for this pass and shut down with it.
    workers : int
        Size of *pool* (with a threaded source and one worker, the producer decodes).
    timeout_s : float
        Longest wait for one batch (0: no limit).

    The hand-over costs the consumer no lock when the batch is ready: finished batches
    go into a dict keyed by step (atomic under the GIL) and the producer's budget is a
    counter; a condition variable is touched only by a side that has to wait, and the
    other side notifies only when it sees that flag (set under the lock before the
    waiter re-checks, so no wake-up is lost).
    """

    def __init__(
        self,
        source: Source,
        first: int,
        last: int,
        assemble: Callable[[RawBatch, int], Any],
        *,
        depth: int,
        workers: int = 1,
        pool: ThreadPoolExecutor | None = None,
        timeout_s: float = 0.0,
        name: str = "feedline",
    ) -> None:
        self.source = source
        self.next_step = first
        self.last = last
        self.assemble = assemble
        self.timeout_s = timeout_s
        self.depth = max(1, depth)
        self.exposed_s = 0.0
        self.delivered = 0
        self._closed = False
        self._pid = os.getpid()  # a forked child's copy must not touch the parent's threads
        self._stalled = False  # the consumer gave up waiting (timeout_s)
        #: True when close() left a producer thread stuck in a read (the source is unusable)
        self.abandoned = False
        self._stop = threading.Event()
        self._inline = inline_run(source, depth)
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._own_pool = False
        self._done: dict[int, tuple[bool, Any]] = {}  # step -> (ok, batch or exception)
        self._taken = first  # steps the consumer has taken (frees producer budget)
        self._cv = threading.Condition()
        self._consumer_waits = False
        self._producer_waits = False
        self._futures: collections.deque[Future] = collections.deque()  # work not yet done
        # a threaded source reads on its own thread: the producer only cuts sub-batches
        # out of its buffers, so it decodes them too, one thread hand-off fewer per step
        self._assemble_here = source.threaded and workers <= 1
        if not self._inline and first < last:
            if self._assemble_here:
                pool = None
            elif pool is None:
                pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"{name}-work")
                self._own_pool = True
            self._pool = pool
            self._thread = threading.Thread(target=self._produce, name=f"{name}-read", daemon=True)
            self._thread.start()

    # -------------------------------------------------------------- producer
    def _wait_budget(self, step: int) -> bool:
        """Block until step is within *depth* of what the consumer took (it holds one)."""
        if step - self._taken < self.depth:
            return True
        with self._cv:
            self._producer_waits = True
            try:
                while step - self._taken >= self.depth:
                    if self._stop.is_set():
                        return False
                    self._cv.wait(_POLL)
            finally:
                self._producer_waits = False
        return not self._stop.is_set()

    def _put(self, step: int, ok: bool, value: Any) -> None:
        self._done[step] = (ok, value)
        if self._consumer_waits:
            with self._cv:
                self._cv.notify_all()

    def _work(self, raw: RawBatch, step: int) -> None:
        try:
            self._put(step, True, self.assemble(raw, step))
        except BaseException as e:  # delivered to the consumer in order
            self._put(step, False, e)

    def _produce(self) -> None:
        step = self.next_step
        try:
            while step < self.last:
                if not self._wait_budget(step):
                    return
                raw = self.source.get(step)
                if self._stop.is_set():
                    return
                if self._assemble_here:
                    self._work(raw, step)
                    step += 1
                    continue
                assert self._pool is not None
                futs = self._futures
                while futs and futs[0].done():
                    futs.popleft()
                futs.append(self._pool.submit(self._work, raw, step))
                step += 1
        except Interrupted:  # SourceStopped, or a wait for peers the stop flag ended
            return
        except BaseException as e:  # delivered to the consumer in order
            self._put(step, False, e)

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
        step = self.next_step
        # the consumer is done with the previous batch: the producer may run one further
        self._taken = step
        if self._producer_waits:
            with self._cv:
                self._cv.notify_all()
        item = self._done.pop(step, None)
        if item is None:
            item = self._wait_item(step, t0)
        ok, value = item
        if not ok:
            raise value
        return value

    def _wait_item(self, step: int, t0: float) -> tuple[bool, Any]:
        with self._cv:
            self._consumer_waits = True
            try:
                while True:
                    item = self._done.pop(step, None)
                    if item is not None:
                        return item
                    if self.timeout_s and time.perf_counter() - t0 > self.timeout_s + _GRACE_S:
                        # reads through the engine raise their own StorageTimeoutError at
                        # timeout_s; this is a stall elsewhere (mmap, a cursor, a peer)
                        self._stalled = True
                        files = getattr(getattr(self.source, "ctx", None), "dataset", None)
                        path = files.files[0] if files is not None else "(dataset)"
                        raise StorageTimeoutError(
                            path,
                            -1,
                            self.timeout_s,
                            f"no batch for step {step} within {self.timeout_s:g} s (timeout_s): "
                            "the reader thread is stalled (storage, or a peer); it was abandoned",
                        )
                    t = self._thread
                    if t is not None and not t.is_alive() and not self._pending():
                        # everything submitted has stored its result (done after _put)
                        if step not in self._done:
                            raise FeedlineError("the loader's reader thread ended without a batch")
                        continue
                    self._cv.wait(_POLL)
            finally:
                self._consumer_waits = False

    def _pending(self) -> bool:
        return any(not f.done() for f in list(self._futures))  # list(): an atomic copy

    # -------------------------------------------------------------- shutdown
    def close(self) -> None:
        """Stop reading, wake and join all threads; idempotent, callable from any thread.

        After the last step was delivered the source is *finished* (it may go on
        reading what it anticipates of the next epoch); before, it is stopped. In a child
        forked while the pass ran it only marks the pass closed.
        """
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._pid:
            # a child forked while this pass ran (its __del__ or the exit hooks): the
            # threads, the pool's workers and the source's reads exist in the parent
            # only; waiting for them (the pool's futures) hung the child's exit
            return
        natural = self.next_step >= self.last
        self._stop.set()
        if not natural:
            self.source.request_stop()  # wakes a get() blocked in the producer
        if self._thread is not None:
            self._thread.join(_GRACE_S if self._stalled else None)
            if self._thread.is_alive():  # stuck in a stalled read: leave it (daemon)
                self.abandoned = True
                if self._pool is not None and self._own_pool:
                    self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
                return  # the source is still in use by that thread: not stopped
            self._thread = None
        try:
            if natural:
                self.source.finish()
            else:
                self.source.stop()
        finally:
            if self._pool is not None and self._own_pool:
                self._pool.shutdown(wait=True, cancel_futures=True)
            elif self._pool is not None:  # a shared pool: this pass's work ends here
                futs = list(self._futures)
                for f in futs:
                    f.cancel()
                wait_futures(futs)
            self._futures.clear()
            self._pool = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
