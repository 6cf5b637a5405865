# SPDX-License-Identifier: Apache-2.0
"""Named MPI operations for the rest of the package (docs/architecture.md: MPI lives in
``dist/``). Callers outside ``dist/`` hold communicators and requests as opaque objects
and act on them only through these functions (and :class:`~feedline.dist.world.World`),
so that no other module imports mpi4py or calls MPI directly.

Every function is safe to call when MPI was never initialised or is already finalized
(they then do nothing, or report that state), because they run on close and exit paths.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from .. import defaults
from ..errors import ConfigError


def _mpi() -> Any:
    from mpi4py import MPI

    return MPI


def finalized() -> bool:
    """Whether MPI has been finalized (False when mpi4py was never loaded)."""
    mod = sys.modules.get("mpi4py.MPI")
    return bool(mod is not None and mod.Is_finalized())


def usable() -> bool:
    """Whether MPI calls can be made now: initialised and not finalized."""
    mod = sys.modules.get("mpi4py.MPI")
    return bool(mod is not None and mod.Is_initialized() and not mod.Is_finalized())


def world_rank() -> int | None:
    """This process's rank in ``COMM_WORLD`` when the program has already initialised
    MPI (never initialises it), else None."""
    try:
        return int(_mpi().COMM_WORLD.Get_rank()) if usable() else None
    except Exception:  # a half-initialised MPI is not ours to judge here
        return None


def require_thread_multiple(what: str) -> None:
    """Raise :class:`ConfigError` unless MPI runs with ``MPI_THREAD_MULTIPLE``
    (*what* needs it: it calls MPI from a thread of its own)."""
    MPI = _mpi()
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise ConfigError(
            f"{what} needs MPI initialised with MPI_THREAD_MULTIPLE: leave "
            "mpi4py.rc.thread_level at its default 'multiple'"
        )


def dup(comm: Any) -> Any:
    """A private copy of *comm* (collective over its ranks)."""
    return comm.Dup()


def free(comm: Any) -> None:
    """Free a communicator made by :func:`dup` (nothing once MPI is finalized)."""
    if comm is not None and not finalized():
        comm.Free()


def iallgather(comm: Any, send: Any, recv: Any) -> Any:
    """Post a non-blocking allgather of the array *send* into *recv* (shape (P, ...));
    returns the request, to poll with :func:`done`."""
    return comm.Iallgather(send, recv)


def isend(comm: Any, buf: Any, dest: int, tag: int) -> Any:
    """Post a non-blocking send of the array *buf* to rank *dest*; returns the request
    (*buf* must stay alive until :func:`done` says so)."""
    return comm.Isend(buf, dest=dest, tag=tag)


def irecv(comm: Any, buf: Any, source: int, tag: int) -> Any:
    """Post a non-blocking receive into the array *buf* from rank *source*."""
    return comm.Irecv(buf, source=source, tag=tag)


def done(request: Any) -> bool:
    """Whether a posted request has completed (a non-blocking test)."""
    return bool(request.Test())


def abort(code: int, message: str) -> None:
    """Print *message* on stderr and end the whole MPI job with *code* (nothing when MPI
    is finalized or was never started). The launcher kills every process as soon as the
    abort reaches it and may drop output it has not forwarded yet (Hydra lost such a
    message about 1 run in 10), so the abort waits ``FEEDLINE_ABORT_DELAY_S`` first."""
    if not usable():
        return
    print(message, file=sys.stderr, flush=True)
    time.sleep(float(defaults.get("abort_delay_s")))
    _mpi().COMM_WORLD.Abort(code)
