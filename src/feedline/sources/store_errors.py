# SPDX-License-Identifier: Apache-2.0
"""The DeepIO store's outcomes (``sources/store.py``): the codes its collectives carry,
the state of a round being loaded (:class:`_RoundLoad`: what this rank tells at C2),
the typed errors every rank raises together, and what is left to do at exit when a
store gave up or a peer died (:func:`flush_orphans`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..dist import ops as mpi
from ..errors import CorruptDataError, FeedlineError, StorageError

_OK, _LEFT, _STORAGE, _CORRUPT, _OTHER, _GONE = 0, 1, 2, 3, 4, 5
_CODE_NAMES = {_STORAGE: "StorageError", _CORRUPT: "CorruptDataError", _OTHER: "an error"}


@dataclass
class _RoundLoad:
    """A round being loaded into the store: C1, this rank's share read, C2 (the stage
    says which collective comes next, so a stopped ``get`` resumes where it was)."""

    round: int
    stage: int = 0  # 0: C1 next; 1: C1 done, the share is read; 2: C2 next
    code: int = _OK  # this rank's outcome, told to the others at C2
    error: BaseException | None = None  # this rank's error, raised after C2
    future: Any = None  # the share's read in flight


_ORPHANS: list[Any] = []  # collectives of stores that gave up: (request, buffers...)
_FLUSH_S = 20.0


def flush_orphans() -> None:
    """At exit (the Loader's exit hook, after closing every Loader; before MPI is
    finalized): complete the collectives a store that gave up
    posted (they complete when the other ranks reach them; this rank must progress them
    or the others wait forever). When a peer died, abort the job instead: MPI cannot
    finalize with a dead rank, and the survivors would hang in ``MPI_Finalize``."""
    if _DEAD:
        mpi.abort(
            70, f"feedline: aborting the MPI job: {_DEAD[0]} (MPI cannot finalize with a dead rank)"
        )
    if not _ORPHANS:
        return
    deadline = time.monotonic() + _FLUSH_S
    while _ORPHANS and not mpi.finalized() and time.monotonic() < deadline:
        if mpi.done(_ORPHANS[0][0]):
            _ORPHANS.pop(0)
        else:
            time.sleep(1e-3)


class StorePeerFailed(FeedlineError):
    """Another rank could not load its share of a round into the in-memory store."""


class StorePeerLeft(FeedlineError):
    """Another rank stopped serving its shares of the store (interrupted in ``close()``)."""


class StorePeerDied(StorePeerFailed):
    """Another rank of the store died (its process is gone) or, on another host, did not
    answer within ``FEEDLINE_STORE_PEER_TIMEOUT_S``: the store cannot go on; MPI cannot
    finalize either, so feedline aborts the job at exit (:func:`flush_orphans`)."""


_DEAD: list[str] = []  # messages of stores that saw a peer die: abort at exit


class StoreOutOfStepError(FeedlineError):
    """The ranks iterate different passes of the store (epochs, seeds, steps, or one
    rank's extra ``iter()``): every rank must run the same passes."""


def _code_of(e: BaseException) -> int:
    if isinstance(e, StorageError):
        return _STORAGE
    if isinstance(e, CorruptDataError):
        return _CORRUPT
    return _OTHER
