# SPDX-License-Identifier: Apache-2.0
"""The iterator of one Loader pass: the single-consumer check, the alarm poll before
each batch and the announcement of this rank's failure (docs/reliability.md)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from threading import get_ident
from typing import TYPE_CHECKING, Any

from .. import _core
from ..errors import ConcurrencyError, StorageTimeoutError

if TYPE_CHECKING:  # pragma: no cover
    from .runner import EpochRun

#: sources that carry a peer's failure to the step where it happened themselves (node
#: window flags, the store's collectives): polling the alarm before each batch would
#: raise PeerFailedError steps earlier on some ranks, and announcing errors their own
#: protocol shares (and may recover from: an out-of-step pass) would poison later
#: passes; their waits still poll it for deaths and other sources' failures
_AGREEING = ("node", "store")


#: the alarm's receive is tested at most this often (a failure is heard within this
#: long, then raised at the next batch): by the producer thread of a threaded pass, once
#: per step, so that the consumer's poll before a ready batch is a clock check (a test
#: costs ~9 us, 10-25 us with 4 ranks on 2 cores); by the consumer when nobody did
ALARM_EVERY_S = 0.005


def listener(loader: Any) -> Any:
    """What a pass's producer thread calls once per step to hear peers' failures off the
    consumer's path (:meth:`~feedline.dist.alarm.Alarm.listen`), or None: no alarm, or
    a source whose protocol shares its failures itself (``_AGREEING``)."""
    alarm = loader._alarm
    if alarm is None or loader._source_name in _AGREEING:
        return None
    return lambda: alarm.listen(ALARM_EVERY_S)


#: completed passes whose seconds Loader.stats() reports (``epoch_s``)
KEEP_PASSES = 8


def _record_pass(loader: Any, run: Any, t0: float | None) -> None:
    """Note a completed pass's wall time (first ``next()`` to its end) and steps, the
    measured side of ``stats()["plan_estimate_s"]``."""
    if t0 is None or getattr(run, "_timed", False):
        return
    run._timed = True
    done = loader.__dict__.setdefault("_pass_times", [])
    done.append(round(time.perf_counter() - t0, 6))
    del done[:-KEEP_PASSES]


class Epoch(_core.PassIter):
    """The iterator of one pass; dropping it (``break``) stops the loader's threads.

    ``next()`` of a ready batch is the per-step price of every read-ahead pass, and on
    a machine whose caches other work (other ranks, other tenants of a VM) cools between
    steps, its price grows with the memory it touches: 26-42 us after a 2.9 ms step on
    the development VM in Python, for ~4 us in a C iterator. So ``next()`` is C
    (``_core.PassIter``, the base): it makes the checks of :meth:`_slow_next`, in the
    same order, and delivers a ready batch; any other case (the first call, another
    thread, a fork, a broken Loader, a replaced pass, the alarm's test due, a batch not
    ready, an error, the end) calls :meth:`_slow_next`, which handles them all.
    """

    if TYPE_CHECKING:  # the base's, set by _bind (its stub leaves private names out)
        _loader: Any
        _run: EpochRun
        _alarm: Any
        _grace: float
        _forks: int
        _owner: int | None

        def _bind(self, *args: Any) -> None: ...

    def __init__(self, loader: Any, run: EpochRun) -> None:
        super().__init__()
        alarm = loader._alarm
        # the alarm polled before each batch (None: none, or a source whose protocol
        # shares failures itself); the consumer tests the receive only when the
        # producer's listening fell behind by a period (none listens in an inline pass)
        self._bind(
            loader,
            run,
            run._h,
            loader._next_lock,
            None if alarm is None or loader._source_name in _AGREEING else alarm,
            0.0 if run._inline else ALARM_EVERY_S,
        )
        self._t0: float | None = None  # the first next() of this pass

    def __iter__(self) -> Epoch:
        return self

    def _enter(self, lo: Any, run: EpochRun) -> None:
        """The checks a batch needs only when something changed (the long way)."""
        me = threading.get_ident()
        if self._owner is None:
            self._owner = me
            self._t0 = time.perf_counter()
        elif self._owner != me:
            raise ConcurrencyError(
                "two threads iterate this Loader: a pass is consumed by the thread that "
                "started it (a Loader has one consumer at a time; give each thread its "
                "own Loader)"
            )
        if os.getpid() != lo._pid or lo._broken is not None:
            lo._check_usable()

    def _slow_next(self) -> Any:
        """``next()`` of every case (the C ``next()`` calls it when a check fails)."""
        lo = self._loader
        if not lo._next_lock.acquire(blocking=False):
            raise ConcurrencyError(
                "two threads iterate this Loader at once: a Loader has one consumer at a "
                "time (give each thread its own Loader)"
            )
        try:
            run = self._run
            if self._owner != get_ident() or self._forks != _core.forks() or lo._broken is not None:
                self._enter(lo, run)
            if run is not lo._run and not lo._closed and run.next_step < run.last:
                raise ConcurrencyError("this pass was replaced by a newer iter() of its Loader")
            alarm = self._alarm
            try:
                # Alarm.poll's own early return, inlined (a call per batch costs more)
                if alarm is not None and (
                    alarm.failure is not None
                    or time.perf_counter() >= alarm._next_test + self._grace
                ):
                    # a peer failed or died: raise, on every rank (the test itself is
                    # the producer's, ``listener``; this one only when it fell behind)
                    alarm.poll(ALARM_EVERY_S, self._grace)
                batch = next(run)
            except StopIteration:
                _record_pass(lo, run, self._t0)
                raise
            except Exception as e:
                run.close()
                if isinstance(e, StorageTimeoutError):
                    lo._broken = str(e)
                if alarm is not None:
                    alarm.announce(e)  # every other rank raises PeerFailedError
                raise
            lo._on_batch(run, batch)
            return batch
        finally:
            lo._next_lock.release()

    def __len__(self) -> int:
        return self._run.last - self._run.next_step

    def close(self) -> None:
        """Stop this pass now (threads joined)."""
        self._run.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._run.close()
