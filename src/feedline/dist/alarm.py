# SPDX-License-Identifier: Apache-2.0
"""Error agreement that cannot hang: the alarm every feedline wait polls, peer liveness,
and the exit guard.

*The alarm.* Each rank keeps one receive posted on a private duplicate of the world
communicator. A rank whose Loader fails (``announce``) sends a short message — its
rank, pid, the exception's type and text, and the pickled exception when it is small —
to every other rank. Every wait feedline issues (``World.wait``: tokens, collectives,
cursor hand-offs; the node source's window flags) polls that receive with its own
request, so a rank blocked anywhere in feedline raises :class:`PeerFailedError` naming
the failed rank and the cause within one poll interval, and a rank that is not blocked
raises it at its next batch.

*Liveness.* A rank killed by a signal cannot announce anything. Its peers on the same
host find out from its pid (checked at most twice a second while they wait: the
process is gone or a zombie) and raise :class:`PeerFailedError` ("rank 2 (pid ...)
died"). Peers on other hosts are bounded by the wait limit: 2 x ``timeout_s`` + 1 s
when the Loader has a ``timeout_s`` (a stalled peer's own ``StorageTimeoutError``,
raised at ``timeout_s``, arrives first), else ``FEEDLINE_PEER_TIMEOUT_S`` (600 s by
default); past it the wait raises :class:`PeerTimeoutError`.

*Shared memory.* The host's first rank removes the names of MPICH's start-up
shared-memory segments once every rank mapped them (:func:`unlink_mapped_shm`), so a
job whose ranks are killed leaves nothing in ``/dev/shm`` (window segments are
unlinked by MPICH itself as soon as they are mapped).

*The exit guard.* MPI cannot finish (``MPI_Finalize``) while a rank is dead or blocked:
after a failure, a plain exit hangs. At interpreter exit (before mpi4py finalizes), a
rank that failed, heard of a failure, or let a ``FeedlineError`` escape does a bounded
barrier with the other ranks in the same situation (``FEEDLINE_EXIT_GRACE_S``, 10 s):
if every rank arrives and nothing is left in flight, MPI finalizes normally; otherwise
(a dead peer, a peer blocked in a collective of the training loop that this rank no
longer joins, requests abandoned in flight) it prints one line saying why and calls
``MPI_Abort`` on ``COMM_WORLD`` — the job ends with an error instead of hanging.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import socket
import sys
import threading
import time
from typing import Any

import numpy as np

from .. import defaults
from ..errors import FeedlineError, PeerFailedError, PeerTimeoutError
from . import ops

_ALARM_TAG = 0xA1A
_MSG_BYTES = 8192
_LIVENESS_S = 0.5


def peer_limit(timeout_s: float) -> float:
    """How long a wait for peers lasts: 2 x ``timeout_s`` + 1 s when the Loader has one
    (a peer's own read may take ``timeout_s`` before it raises and tells everyone), else
    ``FEEDLINE_PEER_TIMEOUT_S``."""
    if timeout_s and timeout_s > 0:
        return 2.0 * timeout_s + 1.0
    return float(defaults.get("peer_timeout_s"))


class Interrupted(Exception):
    """A wait was interrupted by its caller's stop flag (a source being stopped)."""


def unlink_mapped_shm(prefix: str = "/dev/shm/mpich_shm_") -> list[str]:
    """Remove the names of MPICH's start-up shared-memory segments this process maps.

    MPICH unlinks them in ``MPI_Finalize``; a job whose ranks are killed never gets
    there and leaves them in ``/dev/shm`` for good. Every local rank mapped them during
    ``MPI_Init`` (called after a collective, so all have), and the mappings stay valid
    without the names. Returns the paths removed."""
    gone: list[str] = []
    folder, stem = os.path.split(prefix)
    try:  # the usual case, nothing left to unlink, without reading the maps (ms)
        with os.scandir(folder or ".") as it:
            if not any(e.name.startswith(stem) for e in it):
                return gone
    except OSError:
        return gone
    try:
        with open("/proc/self/maps") as f:
            paths = {ln.split(None, 5)[-1].strip() for ln in f if prefix in ln}
    except OSError:
        return gone
    for p in sorted(paths):
        if not p.startswith(prefix) or p.endswith("(deleted)"):
            continue
        with contextlib.suppress(OSError):
            os.unlink(p)
            gone.append(p)
    return gone


class Alarm:
    """One job's failure channel (see the module docstring). Collective to build."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm.Dup()
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        host = socket.gethostname()
        peers = self.comm.allgather((host, os.getpid()))  # startup: a blocking collective
        self._local = {r: pid for r, (h, pid) in enumerate(peers) if h == host and r != self.rank}
        if all(r > self.rank for r in self._local):  # the host's first rank
            unlink_mapped_shm()
        self._buf = np.zeros(_MSG_BYTES, dtype=np.uint8)
        self._recv = self.comm.Irecv(self._buf, source=_any_source(), tag=_ALARM_TAG)
        self._sends: list[tuple[Any, Any]] = []
        self._lock = threading.Lock()
        self.failure: PeerFailedError | None = None  # what this rank heard
        self.announced: BaseException | None = None  # what this rank told
        self.dead: list[int] = []
        self.abandoned = 0  # requests given up in flight (MPI_Finalize could wait on them)
        self._next_liveness = 0.0
        self._next_test = 0.0  # poll(every_s): when the receive is tested next (perf_counter)
        self._pid = os.getpid()

    # ------------------------------------------------------------- sending
    def announce(self, exc: BaseException) -> None:
        """Tell every other rank that this rank failed with *exc* (once; never blocks)."""
        with self._lock:
            if self.announced is not None or self.failure is not None or self.forked():
                return
            if self.comm is None:  # closed
                return
            if isinstance(exc, PeerFailedError):
                return  # heard, not caused: the failed rank tells everyone itself
            self.announced = exc
            msg = {
                "rank": self.rank,
                "pid": os.getpid(),
                "type": type(exc).__name__,
                "text": str(exc),
            }
            blob = json.dumps(msg).encode()[: _MSG_BYTES // 2]
            try:
                pick = pickle.dumps(exc)
            except Exception:
                pick = b""
            if len(blob) + len(pick) + 8 > _MSG_BYTES:
                pick = b""
            data = np.zeros(8 + len(blob) + len(pick), dtype=np.uint8)
            data[:8] = np.frombuffer(np.int64(len(blob)).tobytes(), dtype=np.uint8)
            data[8 : 8 + len(blob)] = np.frombuffer(blob, dtype=np.uint8)
            data[8 + len(blob) :] = np.frombuffer(pick, dtype=np.uint8)
            for r in range(self.size):
                if r != self.rank:
                    self._sends.append((self.comm.Isend(data, dest=r, tag=_ALARM_TAG), data))

    # ----------------------------------------------------------- receiving
    def forked(self) -> bool:
        """True in a child forked from the process that built this alarm (MPI unusable)."""
        return os.getpid() != self._pid

    def poll(self, every_s: float = 0.0, grace_s: float = 0.0) -> None:
        """Raise :class:`PeerFailedError` if a peer announced a failure or died.

        With *every_s*, the receive is tested at most that often (the Loader's poll
        before each batch: an MPI test costs ~9 us, which a double-buffered pass's
        consumer paid at every step); a failure already heard raises at once. With
        *grace_s*, the test is left that much longer to a thread that :meth:`listen` s
        (the consumer tests only when the listener fell behind, e.g. in a long read)."""
        if self.failure is not None:
            raise self.failure
        if every_s:  # pipeline.passes.Epoch.__next__ inlines this check before calling
            now = time.perf_counter()
            if now < self._next_test + grace_s:
                return
            self._next_test = now + every_s
        self._test(block=True)
        if self.failure is not None:
            raise self.failure

    def listen(self, every_s: float) -> None:
        """Test the receive and the local peers' liveness at most every *every_s*, like
        :meth:`poll`, without raising: what it hears waits in :attr:`failure` for the
        next :meth:`poll`. A Loader's producer thread listens once per step, so the
        consumer's own poll before each batch is a clock check (the test costs ~9 us,
        more with ranks sharing cores, and a ready batch should cost its consumer
        nothing). Never blocks on the consumer: if it is testing, this returns."""
        if self.failure is not None:
            return
        now = time.perf_counter()
        if now < self._next_test:
            return
        self._next_test = now + every_s
        self._test(block=False)

    def _test(self, block: bool) -> None:
        """Test the receive (under the lock; without *block*, only if it is free) and,
        every ``_LIVENESS_S``, whether the local peers' processes are alive."""
        if self.forked() or self.comm is None:
            return
        if not self._lock.acquire(blocking=block):
            return
        try:
            if self.comm is None:  # closed meanwhile (by another thread)
                return
            done = self._recv.Test() if self._recv is not None else False
            if done:
                self._recv = None
                self.failure = self._decode()
            now = time.monotonic()
            if self.failure is None and self._local and now >= self._next_liveness:
                self._next_liveness = now + _LIVENESS_S
                for r, pid in self._local.items():
                    if not pid_alive(pid):
                        self.dead.append(r)
                        self.failure = PeerFailedError(
                            r, f"rank {r} (pid {pid}) died (killed, or exited without feedline)"
                        )
                        break
        finally:
            self._lock.release()

    def _decode(self) -> PeerFailedError:
        n = int(self._buf[:8].view(np.int64)[0])
        msg = json.loads(self._buf[8 : 8 + n].tobytes())
        cause: BaseException | None = None
        rest = self._buf[8 + n :].tobytes()
        if rest.strip(b"\0"):
            with contextlib.suppress(Exception):
                cause = pickle.loads(rest)
        err = PeerFailedError(int(msg["rank"]), f"{msg['type']}: {msg['text']}", cause=cause)
        return err

    # -------------------------------------------------------------- waiting
    def wait(
        self,
        request: Any,
        *,
        timeout_s: float = 0.0,
        stop: Any = None,
        what: str = "a peer",
        pause: float | None = None,
    ) -> Any:
        """Complete *request* by polling it, the alarm and liveness; bounded by
        *timeout_s* (0: the ``peer_timeout_s`` default); *stop* (an Event) interrupts."""
        if pause is None:
            pause = defaults.get("poll_sleep_us") * 1e-6
        limit = peer_limit(timeout_s)
        deadline = time.monotonic() + limit if limit > 0 else None
        while True:
            done, status = request.test()
            if done:
                return status
            try:
                self.poll()
                if stop is not None and stop.is_set():
                    raise Interrupted()
                if deadline is not None and time.monotonic() > deadline:
                    raise PeerTimeoutError(
                        f"rank {self.rank}: no progress from {what} within {limit:g} s "
                        "(a peer is stalled, blocked elsewhere or gone); see timeout_s= and "
                        "FEEDLINE_PEER_TIMEOUT_S"
                    )
            except BaseException:
                self.abandoned += 1
                with contextlib.suppress(Exception):
                    request.Cancel()
                raise
            time.sleep(pause)

    def close(self) -> None:
        """Release the channel when nothing went wrong (a failed job keeps it for the
        exit guard). Not collective in practice (MPICH frees a communicator locally)."""
        if self.in_error() or self.forked() or self.comm is None:
            return
        with self._lock:
            if self._recv is not None:
                with contextlib.suppress(Exception):
                    self._recv.Cancel()
                    self._recv.Wait()
                self._recv = None
            with contextlib.suppress(Exception):
                self.comm.Free()
            self.comm = None
        with contextlib.suppress(ValueError):
            _ALARMS.remove(self)

    # ---------------------------------------------------------------- exit
    def in_error(self) -> bool:
        return self.announced is not None or self.failure is not None

    def exit_check(self, escaped: BaseException | None) -> str | None:
        """At exit: None when MPI can finalize, else why it must abort."""
        if self.forked() or self.comm is None:
            return None
        with contextlib.suppress(FeedlineError):
            self.poll()  # hear late news before deciding
        if self.dead:
            return f"rank {self.dead[0]} died"
        if escaped is None and not self.in_error():
            return None
        if escaped is not None and not self.in_error():
            self.announce(escaped)
        grace = float(defaults.get("exit_grace_s"))
        req = self.comm.Ibarrier()  # only ranks in error come here: bounded
        deadline = time.monotonic() + grace
        while not req.Test():
            if time.monotonic() > deadline:
                return (
                    f"not every rank reached the end within {grace:g} s of this rank's "
                    "failure (a rank may be blocked in a collective of the training loop, "
                    "or dead)"
                )
            with contextlib.suppress(FeedlineError):
                self.poll()
            if self.dead:
                return f"rank {self.dead[0]} died"
            time.sleep(1e-3)
        for req, _ in self._sends:
            with contextlib.suppress(Exception):
                req.Test()
        if self.abandoned:
            return f"{self.abandoned} MPI request(s) were abandoned in flight"
        return None


class WaitBound:
    """For waits that poll their own flags (node windows): :meth:`check` raises like
    :meth:`Alarm.wait` — a peer's failure or death, or past the world's bound."""

    def __init__(self, world: Any, what: str) -> None:
        self.alarm = getattr(world, "alarm", None)
        self.what = what
        limit = peer_limit(float(getattr(world, "timeout_s", 0.0) or 0.0))
        self.limit = limit
        self.deadline = time.monotonic() + limit if limit > 0 else None

    def check(self) -> None:
        if self.alarm is not None:
            self.alarm.poll()
        if self.deadline is not None and time.monotonic() > self.deadline:
            rank = self.alarm.rank if self.alarm is not None else 0
            raise PeerTimeoutError(
                f"rank {rank}: no progress from {self.what} within {self.limit:g} s (a peer "
                "is stalled, blocked elsewhere or gone); see timeout_s= and "
                "FEEDLINE_PEER_TIMEOUT_S"
            )


def pid_alive(pid: int) -> bool:
    """Whether process *pid* of this host still runs (a zombie counts as dead; when its
    state cannot be read, alive)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _any_source() -> int:
    from mpi4py import MPI

    return MPI.ANY_SOURCE


# ------------------------------------------------------------ the exit guard
_ALARMS: list[Alarm] = []
_ESCAPED: list[BaseException] = []
_installed = False


def register(alarm: Alarm) -> None:
    """Watch *alarm* at exit; install the exception hook once."""
    global _installed
    _ALARMS.append(alarm)
    if not _installed:
        _installed = True
        prev = sys.excepthook

        def hook(tp, value, tb):
            if isinstance(value, FeedlineError):
                _ESCAPED.append(value)
            prev(tp, value, tb)

        sys.excepthook = hook


def note_escape(exc: BaseException) -> None:
    """Record a FeedlineError that ends the program (for callers with their own hooks)."""
    _ESCAPED.append(exc)


def exit_guard() -> None:
    """At interpreter exit, before MPI is finalized: abort rather than hang (module doc)."""
    if not _ALARMS:
        return
    try:
        from mpi4py import MPI
    except ImportError:  # pragma: no cover
        return
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return
    escaped = _ESCAPED[-1] if _ESCAPED else None
    if str(defaults.get("abort_on_error")) == "0":
        return
    for alarm in _ALARMS:
        why = alarm.exit_check(escaped)
        if why is None:
            continue
        cause = alarm.announced or alarm.failure or escaped
        text = f"{type(cause).__name__}: {cause}" if cause is not None else "a peer failed"
        ops.abort(
            1,
            f"feedline: rank {alarm.rank} ends after {text}; {why}: calling MPI_Abort so "
            "that the job does not hang in MPI_Finalize (docs/reliability.md)",
        )
    return
