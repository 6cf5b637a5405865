# SPDX-License-Identifier: Apache-2.0
"""The hand-off between a pass's producer thread and its consumer (pipeline/runner.py):
a ready batch costs the consumer no thread wake-up once it takes steps slower than
``_RING_BELOW_S`` (the producer paces itself), every batch still arrives in order, and
closing a pass whose producer is pacing itself returns at once."""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import pytest
from feedline._core import Bell as _Bell

from feedline.pipeline import runner
from feedline.pipeline.runner import _RING_BELOW_S, EpochRun
from feedline.sources.base import RawBatch


class _Ready:
    """A threaded source whose batches are ready (cut out of its buffers), or take
    *read_s* each (a sleep: the GIL is free meanwhile)."""

    threaded = True

    def __init__(self, read_s: float = 0.0) -> None:
        self.finished = self.stopped = False
        self.read_s = read_s

    def get(self, step: int) -> RawBatch:
        if self.read_s:
            time.sleep(self.read_s)
        return RawBatch(np.array([step]), np.full(8, step % 251, np.uint8), np.array([8]))

    def finish(self) -> None:
        self.finished = True

    def request_stop(self) -> None:
        pass

    def stop(self) -> None:
        self.stopped = True


def _run(steps: int, period_s: float) -> tuple[EpochRun, list[int]]:
    run = EpochRun(_Ready(), 0, steps, lambda raw, s: (s, raw.ids[0]), depth=2)
    got = []
    for step, sid in run:
        got.append(int(sid))
        assert step == sid
        time.sleep(period_s)
    return run, got


def test_a_slow_consumer_does_not_wake_the_producer_at_every_step():
    run, got = _run(60, 3 * _RING_BELOW_S)
    assert got == list(range(60))
    # the first steps ring (the period is not known yet), then the producer paces
    # itself; a ring now and then when it overslept (the old hand-off rang 60 times)
    assert run._producer_bell.rings <= 20
    assert run.source.finished


def test_a_fast_consumer_is_rung_for():
    run, got = _run(200, 0.0)
    assert got == list(range(200))
    assert run._period < _RING_BELOW_S  # a step every few us: rung at each step


def test_closing_a_pacing_producer_returns_at_once():
    run = EpochRun(_Ready(), 0, 1000, lambda raw, s: s, depth=2)
    for _ in range(6):
        next(run)
        time.sleep(0.03)  # a 30 ms step: the producer sleeps until just before the next
    t0 = time.perf_counter()
    run.close()
    assert time.perf_counter() - t0 < 0.5
    assert run._thread is None and run.source.stopped


def test_a_long_step_does_not_make_the_producer_oversleep():
    """One long step (an evaluation) inflates the average period; the consumer then
    rings the producer when it comes earlier than the producer meant to look, so the
    reads after it stay hidden (without that, ~10 steps waited for a whole read)."""
    run = EpochRun(_Ready(read_s=0.004), 0, 1000, lambda raw, s: s, depth=2)
    for _ in range(30):
        next(run)
        time.sleep(0.006)
    time.sleep(0.5)
    slow = 0
    for _ in range(30):
        t0 = time.perf_counter()
        next(run)
        slow += time.perf_counter() - t0 > 0.003
        time.sleep(0.006)
    run.close()
    assert slow <= 4


def test_a_paused_consumer_costs_no_polling():
    """A consumer that stops taking steps for a while (the iterator kept) is rung for
    when it is back; the producer does not look 16 times a period meanwhile (a 1 s
    pause at a 1.5 ms period would be ~10,000 wake-ups)."""
    run = EpochRun(_Ready(), 0, 1000, lambda raw, s: s, depth=2)
    for _ in range(30):
        next(run)
        time.sleep(0.0015)
    w0 = run._producer_bell.waits
    time.sleep(1.0)
    assert run._producer_bell.waits - w0 <= 60  # _POLL (50 ms) sleeps, and a few looks
    assert [next(run) for _ in range(5)] == list(range(30, 35))
    run.close()


def _next_in_thread(it):
    """Call next(it) in a new thread; (the thread, the list its exception lands in)."""
    got: list[BaseException] = []

    def consume():
        try:
            next(it)
        except BaseException as e:
            got.append(e)

    t = threading.Thread(target=consume)
    t.start()
    return t, got


def test_close_from_another_thread_ends_a_blocked_next():
    """A consumer blocked in next() (a slow read, no timeout_s) when another thread
    closes the pass gets StopIteration at once, not a wait for ever."""
    run = EpochRun(_Ready(read_s=0.3), 0, 100, lambda raw, s: s, depth=2)
    t, got = _next_in_thread(run)
    time.sleep(0.05)
    run.close()
    t.join(2.0)
    assert not t.is_alive() and len(got) == 1 and isinstance(got[0], StopIteration)


def test_bell_never_loses_a_ring():
    """A waiter that raised its flag and re-checked sees every change a ringer made
    before ringing: 20,000 hand-offs between two threads, none lost (a lost one leaves
    the waiter asleep until its 1 s timeout)."""
    bell, box, n = _Bell(), [0], 20_000
    timeouts = 0
    done = threading.Event()

    def ringer():
        for i in range(1, n + 1):
            box[0] = i
            bell.ring()
        done.set()

    t = threading.Thread(target=ringer)
    seen, t0 = 0, time.perf_counter()
    t.start()
    while seen < n:
        bell.waiting = True
        if box[0] != seen:
            seen = box[0]
            bell.waiting = False
            continue
        w0 = time.perf_counter()
        bell.wait(1.0)
        bell.waiting = False
        timeouts += time.perf_counter() - w0 >= 0.99 and box[0] == seen and not done.is_set()
        assert time.perf_counter() - t0 < 60
    t.join()
    assert done.is_set() and seen == n and timeouts == 0


def test_the_producer_listens_for_peer_failures_off_the_consumers_path():
    """The failure alarm's test runs on the producer thread, once per step; the
    consumer's next() of a ready batch does not make it."""
    callers: list[str] = []
    run = EpochRun(
        _Ready(),
        0,
        40,
        lambda raw, s: s,
        depth=2,
        listen=lambda: callers.append(threading.current_thread().name),
    )
    assert list(run) == list(range(40))
    assert len(callers) == 40
    assert threading.current_thread().name not in callers


def test_the_consumers_alarm_poll_leaves_the_test_to_a_listener(monkeypatch):
    """Alarm.poll with a grace period does not test while a listener keeps testing, and
    tests again once the listener fell behind by the grace (a read stuck in storage).
    The alarm's channel is a stand-in: MPI initialised in this process would change
    what other tests see (``progress.process_rank``)."""
    from feedline.dist.alarm import Alarm

    class _Recv:
        def Test(self):
            return False

        def Cancel(self):
            pass

        def Wait(self):
            pass

    class _Comm:
        def Free(self):
            pass

    alarm = Alarm.__new__(Alarm)
    alarm.comm, alarm._recv, alarm._lock = _Comm(), _Recv(), threading.Lock()
    alarm.failure = alarm.announced = None
    alarm.dead, alarm._local, alarm._pid = [], {}, os.getpid()
    alarm._next_test = alarm._next_liveness = 0.0
    tests: list[bool] = []
    orig = Alarm._test
    monkeypatch.setattr(
        Alarm, "_test", lambda self, block: (tests.append(block), orig(self, block))
    )
    every = 0.05
    alarm.listen(every)
    assert tests == [False]
    for _ in range(5):
        alarm.poll(every, every)  # the listener tested just now: a clock check
    assert tests == [False]
    time.sleep(2 * every + 0.02)
    alarm.poll(every, every)  # nobody listened for two periods: the consumer tests
    assert tests == [False, True]
    alarm.listen(every)  # tested just now by the consumer: the listener waits its turn
    assert tests == [False, True]
    alarm.close()
    time.sleep(every)
    alarm.listen(every)  # a producer still running after the close: nothing to test
    alarm.poll(every, every)
    assert alarm.failure is None


def test_a_waiting_consumer_is_handed_the_gil_with_its_batch(monkeypatch):
    """The producer yields the GIL after putting a batch only when the consumer waits
    for it (a ring that woke someone): a ready batch costs the producer nothing, and a
    consumer that waited does not wait again for the producer's next forced GIL switch
    (up to 5 ms) while the producer works on the next step."""
    bell = _Bell()
    assert bell.ring() is False  # nobody waits
    bell.waiting = True
    assert bell.ring() is True and bell.waiting is False
    handed: list[int] = []
    monkeypatch.setattr(runner, "_hand_gil", lambda: handed.append(1))
    # a consumer far slower than the reads: its batches are always ready
    run, got = _run(30, 3 * _RING_BELOW_S)
    assert got == list(range(30)) and handed == []
    # reads slower than the consumer: it waits for (nearly) every batch
    run = EpochRun(_Ready(read_s=0.004), 0, 30, lambda raw, s: int(raw.ids[0]), depth=2)
    assert list(run) == list(range(30))
    assert 15 <= len(handed) <= 30


# ------------------------------------------------------------------ the C next()


def test_handoff_keeps_results_by_step_in_and_out_of_its_window():
    """Handoff.put/pop: results come back by step whatever the order they were put in,
    including steps far outside the ring (kept aside), and once only."""
    from feedline._core import Handoff

    h = Handoff(10, 100, 2, _Bell(), _Bell())
    assert h.pop(10) is None and not h.has(10)
    err = ValueError("read failed")
    h.put(11, True, "b11", 3, 30)
    h.put(10, True, "b10")
    h.put(12, False, err)
    h.put(10 + 64, True, "far")  # the same ring slot as a held step would collide
    h.put(10 + 1024, True, "farther")
    assert h.held == 5
    assert h.pop(10) == (True, "b10") and h.pop(10) is None
    assert h.pop(12) == (False, err)
    assert h.pop(74) == (True, "far") and h.pop(1034) == (True, "farther")
    assert h.pop(11) == (True, "b11") and h.held == 0
    h.put(13, True, None)
    h.clear()
    assert h.held == 0 and h.pop(13) is None


def test_gate_is_a_non_blocking_flag():
    from feedline._core import Gate

    g = Gate()
    assert g.acquire(blocking=False) and g.locked()
    assert not g.acquire(blocking=False)
    g.release()
    assert not g.locked()
    with pytest.raises(ValueError):
        g.release()
    with pytest.raises(ValueError):
        g.acquire()  # blocking: nothing may wait on it


def test_monotonic_is_perf_counter():
    from feedline import _core

    a, b, c = time.perf_counter(), _core.monotonic(), time.perf_counter()
    assert a <= b <= c


def test_c_next_delivers_ready_batches_and_counts_them_like_python(tmp_path, monkeypatch):
    """Loader passes are consumed through the C next(): it delivers every ready batch
    (the Python path runs only for the first call, waits and the end), and leaves the
    Loader's step, batch, sample and byte counts where the Python path leaves them."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "mpi"))
    from loader_common import make_records

    from feedline import Loader
    from feedline.pipeline import passes

    ds, _ = make_records(str(tmp_path / "ds"), n=400, size=24, files=2)
    slow = [0]
    orig = passes.Epoch._slow_next

    def counted(self):
        slow[0] += 1
        return orig(self)

    monkeypatch.setattr(passes.Epoch, "_slow_next", counted)

    def run(loader, pause):
        ids, steps = [], []
        it = iter(loader)
        for b in it:
            ids += b.ids.tolist()
            steps.append(b.step)
            assert loader.state_dict()["step"] == b.step + 1
            time.sleep(pause)  # the next batch is ready when asked for
        return ids, steps

    with Loader(ds, batch_size=8, preset="async-db", seed=3) as loader:
        ids, steps = run(loader, 0.004)
        st = loader.stats()
    assert sorted(ids) == list(range(400)) and steps == list(range(50))
    assert st["steps"] == 50 and st["samples"] == 400 and st["payload_bytes"] == 400 * 24
    assert slow[0] <= 10  # the first call, the end, a batch or two not ready yet
    # the same through the Python path only: the same order and the same counts
    monkeypatch.setattr(passes.Epoch, "__next__", lambda self: self._slow_next())
    with Loader(ds, batch_size=8, preset="async-db", seed=3) as loader:
        ids2, steps2 = run(loader, 0.0)
        st2 = loader.stats()
    assert ids2 == ids and steps2 == steps
    assert {k: st2[k] for k in ("steps", "samples", "payload_bytes")} == {
        k: st[k] for k in ("steps", "samples", "payload_bytes")
    }


def test_c_next_leaves_other_threads_and_replaced_passes_to_python(tmp_path):
    """What the Python next() refuses, the C next() refuses too: another thread than the
    pass's consumer, and a pass replaced by a newer iter()."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "mpi"))
    from loader_common import make_records

    from feedline import ConcurrencyError, Loader

    ds, _ = make_records(str(tmp_path / "ds"), n=200, size=16, files=1)
    with Loader(ds, batch_size=4, preset="async-db") as loader:
        it = iter(loader)
        next(it)
        time.sleep(0.05)  # the next batch is ready: the C path would deliver it
        t, got = _next_in_thread(it)
        t.join(5)
        assert len(got) == 1 and isinstance(got[0], ConcurrencyError)
        next(it)  # its own consumer goes on
        it2 = iter(loader)
        with pytest.raises(ConcurrencyError, match="replaced"):
            next(it)
        assert next(it2).step == 2  # iter() mid-epoch goes on from where the epoch is


def test_handoff_refuses_negative_steps_and_replaces_a_step_put_again():
    from feedline._core import Bell, Handoff

    h = Handoff(0, 10, 2, Bell(), Bell())
    with pytest.raises(ValueError):
        h.put(-1, True, "x")
    assert h.pop(-1) is None and not h.has(-1)
    h.put(3, True, "first")
    h.put(3, True, "second")
    assert h.held == 1 and h.pop(3) == (True, "second") and not h.has(3)


def test_a_failed_pass_is_collected_with_what_it_held():
    """Errors stored for steps never taken hold tracebacks whose frames hold the pass:
    the garbage collector must see through the native Handoff to free the cycle (and
    the source, whose buffers the pass may share)."""
    import gc
    import weakref

    def assemble(raw, s):
        if s >= 3:
            raise ValueError(f"bad {s}")
        return s

    run = EpochRun(_Ready(), 0, 50, assemble, depth=6)
    assert next(run) == 0
    time.sleep(0.2)  # the producer has put its budget's worth, errors included
    with pytest.raises(ValueError):
        for _ in run:
            pass
    assert run._h.held >= 1  # errors of steps never taken
    refs = [weakref.ref(run), weakref.ref(run.source)]
    del run
    gc.collect()
    assert [r() for r in refs] == [None, None]


def test_a_batch_the_producer_cannot_count_takes_the_python_path(tmp_path):
    """A transform whose result has ids but no lengths: counting it fails on the
    producer, so its next() takes the Python path, which raises there (as before)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "mpi"))
    from loader_common import make_records

    from feedline import Loader

    class Odd:
        ids = [1, 2]

    ds, _ = make_records(str(tmp_path / "ds"), n=40, size=8, files=1)
    with Loader(ds, batch_size=4, preset="async-db", transform=lambda b: Odd()) as loader:
        it = iter(loader)
        with pytest.raises(AttributeError):
            next(it)
        time.sleep(0.05)  # the next one is ready: still the Python path
        with pytest.raises(AttributeError):
            next(it)
