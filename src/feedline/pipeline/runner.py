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
(6-21 us) instead of a copy and a decode. The consumer's time spent waiting in
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

import numpy as np

from .. import _core
from ..dist.alarm import Interrupted
from ..errors import FeedlineError, StorageTimeoutError
from ..sources.base import RawBatch, Source

_POLL = 0.05  # seconds between checks of the stop flag while blocked
#: a consumer taking steps at least this often rings the waiting producer at each step
_RING_BELOW_S = 1e-3
_LOOK_MIN_S = 50e-6  # a pacing producer's shortest sleep
_GRACE_S = 1.0  # past timeout_s, how long the consumer waits for the reader's own error
#: after waking a consumer that waited for its batch, the producer sleeps this long (the
#: kernel's timer slack makes it ~60-100 us) so that the consumer takes the GIL now
#: (EpochRun._put; docs/loader.md, "The hand-over")
_HAND_GIL_S = 20e-6


def _hand_gil() -> None:
    """The consumer was waiting for the batch just put: it wakes needing the GIL, which
    the producer, going on with the next step in Python, would hold until the next
    forced switch (``sys.getswitchinterval()``, 5 ms); a short sleep hands it over."""
    time.sleep(_HAND_GIL_S)


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
    light : bool
        *assemble* only wraps the records (no decoding, unpacking or transform): the
        producer does it, one thread hand-off (a futex wake on a loaded machine) fewer
        per step.
    timeout_s : float
        Longest wait for one batch (0: no limit).
    listen : callable, optional
        Called by the producer thread before each step (the Loader's: the failure
        alarm's paced test, so that the consumer's check before a batch is cheap).

    The hand-over costs the consumer no lock when the batch is ready: finished batches
    go into a native :class:`feedline._core.Handoff` by step (ordered by the GIL) and
    the producer's budget is a counter. A side that has to wait raises its flag,
    re-checks, and sleeps on its :class:`feedline._core.Bell`; the other side rings the
    bell only when it sees the flag (a single futex wake: 13 us less per step than
    notifying a ``threading.Condition``, which the consumer paid at every step of a
    double-buffered pass because the producer waits for budget there). Consumed
    through :class:`~feedline.pipeline.passes.Epoch`, next() of a ready batch runs in C
    (``_core.PassIter``); this class's ``__next__`` is the same hand-over in Python.
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
        light: bool = False,
        timeout_s: float = 0.0,
        name: str = "feedline",
        listen: Callable[[], None] | None = None,
    ) -> None:
        self.source = source
        self._listen = listen
        self.last = last
        self.assemble = assemble
        self.timeout_s = timeout_s
        self.depth = max(1, depth)
        self.exposed_s = 0.0
        self._closed = False
        self._close_lock = threading.Lock()
        self._pid = os.getpid()  # a forked child's copy must not touch the parent's threads
        self._stalled = False  # the consumer gave up waiting (timeout_s)
        #: True when close() left a producer thread stuck in a read (the source is unusable)
        self.abandoned = False
        self._stop = threading.Event()
        self._inline = inline_run(source, depth)
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._own_pool = False
        # the batches put and not yet taken, the consumer's next step, the steps it took
        # (which free producer budget), its step period (a moving average that paces a
        # waiting producer) and both sides' bells
        self._consumer_bell = _core.Bell()  # rung by the producer when a batch is put
        self._producer_bell = _core.Bell()  # rung by the consumer when it takes a step
        self._h = _core.Handoff(first, last, self.depth, self._consumer_bell, self._producer_bell)
        self._futures: collections.deque[Future] = collections.deque()  # work not yet done
        # a threaded source reads on its own thread: the producer only cuts sub-batches
        # out of its buffers, so it decodes them too, one thread hand-off fewer per step;
        # so it does when there is nothing to decode
        self._assemble_here = light or (source.threaded and workers <= 1)
        if not self._inline and first < last:
            if self._assemble_here:
                pool = None
            elif pool is None:
                pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"{name}-work")
                self._own_pool = True
            self._pool = pool
            self._thread = threading.Thread(target=self._produce, name=f"{name}-read", daemon=True)
            self._thread.start()

    @property
    def next_step(self) -> int:
        """The next step to deliver."""
        return int(self._h.next_step)

    @property
    def delivered(self) -> int:
        """Batches delivered so far."""
        return int(self._h.delivered)

    @property
    def _period(self) -> float:
        """The consumer's step period, seconds (a moving average)."""
        return float(self._h.period)

    # -------------------------------------------------------------- producer
    def _wait_budget(self, step: int) -> bool:
        """Block until step is within *depth* of what the consumer took (it holds one).

        While the consumer takes a step every ``_RING_BELOW_S`` or faster, it rings this
        thread awake at each step. A slower consumer (a training step of milliseconds)
        does not: ringing costs it a futex wake per step (5-10 us on a VM), so this
        thread sleeps until just before the consumer is expected to take its next step
        (its period, averaged) and then looks every sixteenth of a period. The consumer
        still rings when it comes earlier than this thread means to look (a step shorter
        than the average, e.g. after a long one) or finds its batch missing; and when it
        is overdue by a period (it paused), this thread sleeps until it is rung.
        """
        bell, h = self._producer_bell, self._h
        while step - h.taken >= self.depth:
            if self._stop.is_set():
                return False
            period = h.period
            due = h.taken_t + period * (step - h.taken - self.depth + 1)
            now = time.perf_counter()
            # a consumer overdue by a period paused (an evaluation, a checkpoint): it
            # rings when it is back, instead of this thread looking 16 times a period
            bell.urgent = period < _RING_BELOW_S or now > due + period
            bell.waiting = True
            if step - h.taken < self.depth:  # re-check after raising the flag
                break
            if bell.urgent:
                bell.wait(_POLL)
                continue
            sleep = min(_POLL, max(due - now - period / 8, period / 16, _LOOK_MIN_S))
            bell.wake_at = now + sleep
            bell.wait(sleep)
        bell.waiting = False
        return not self._stop.is_set()

    def _put(self, step: int, ok: bool, value: Any) -> None:
        # what Loader._on_batch counts, taken here off the consumer's path (-1: nothing to
        # count; -2: counting failed, so the consumer takes the Python path, which raises)
        samples, nbytes = -1, 0
        try:
            ids = getattr(value, "ids", None) if ok else None  # a transform may return another type
            if ids is not None:
                counted = getattr(value, "nbytes", None)  # counted in the worker
                nbytes = int(np.asarray(value.lengths).sum() if counted is None else counted)
                samples = len(ids)
        except Exception:
            samples, nbytes = -2, 0
        if self._h.put(step, ok, value, samples, nbytes):
            _hand_gil()

    def _work(self, raw: RawBatch, step: int) -> None:
        try:
            self._put(step, True, self.assemble(raw, step))
        except BaseException as e:  # delivered to the consumer in order
            self._put(step, False, e)

    def _produce(self) -> None:
        step = self.next_step
        try:
            listen = self._listen
            while step < self.last:
                if not self._wait_budget(step):
                    return
                if listen is not None:
                    listen()  # hear peers' failures here, not in the consumer's next()
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
        # one frame for the ready batch of a read-ahead pass (docs/loader.md, "The
        # hand-over"): what a step costs the consumer grows with the memory it touches
        h = self._h
        step = h.next_step
        if self._closed or step >= self.last:
            self.close()
            raise StopIteration
        t0 = time.perf_counter()
        h.tick(t0)  # the consumer's step period, which paces a waiting producer
        if self._inline:
            try:
                batch = self.assemble(self.source.get(step), step)
            except BaseException:
                self.close()
                raise
            finally:
                self.exposed_s += time.perf_counter() - t0
        else:
            # the consumer is done with the previous batch: the producer may run one
            # further (rung for, or rung when it would look too late: a long step)
            h.release(step, t0)
            item = h.pop(step)
            if item is None:
                # not ready: the wait is exposed I/O (a ready batch's hand-over is not
                # timed: the clock would cost as much as the hand-over itself)
                self._producer_bell.ring()  # it may be pacing itself: this step needs it now
                try:
                    item = self._wait_item(step, t0)
                except BaseException:
                    self.close()
                    raise
                finally:
                    self.exposed_s += time.perf_counter() - t0
            ok, batch = item
            if not ok:
                self.close()
                raise batch
        h.next_step = step + 1
        h.delivered += 1
        return batch

    def _wait_item(self, step: int, t0: float) -> tuple[bool, Any]:
        bell = self._consumer_bell
        try:
            while True:
                bell.waiting = True
                item = self._h.pop(step)  # re-check after raising the flag
                if item is not None:
                    return item
                if self._closed:  # close() from another thread: this pass ends here
                    raise StopIteration
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
                    if not self._h.has(step):
                        raise FeedlineError("the loader's reader thread ended without a batch")
                    continue
                bell.wait(_POLL)
        finally:
            bell.waiting = False

    def _pending(self) -> bool:
        return any(not f.done() for f in list(self._futures))  # list(): an atomic copy

    # -------------------------------------------------------------- shutdown
    def close(self) -> None:
        """Stop reading, wake and join all threads; idempotent, callable from any thread.

        After the last step was delivered the source is *finished* (it may go on
        reading what it anticipates of the next epoch); before, it is stopped. In a child
        forked while the pass ran it only marks the pass closed.
        """
        with self._close_lock:  # two threads closing at once: one does the work
            if self._closed:
                return
            self._h.closed = True  # Epoch's next() in C takes the long way from now on
            self._closed = True
        if os.getpid() != self._pid:
            # a child forked while this pass ran (its __del__ or the exit hooks): the
            # threads, the pool's workers and the source's reads exist in the parent
            # only; waiting for them (the pool's futures) hung the child's exit
            return
        natural = self.next_step >= self.last
        self._stop.set()
        self._producer_bell.ring(always=True)  # a producer waiting for budget returns now
        self._consumer_bell.ring(always=True)  # so does a consumer waiting for a batch
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
