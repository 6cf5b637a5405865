# SPDX-License-Identifier: Apache-2.0
"""JAX adapter: host-local feedline batches, and global arrays across processes.

In a multi-process JAX job every process (= feedline rank) holds its own part of the
global batch; :func:`global_batches` turns each step's sub-batches into one global
``jax.Array`` with ``jax.make_array_from_process_local_data``. JAX needs equal shards,
so the global batch must divide evenly among the processes and the last partial step
must be dropped (``drop_last=True``); otherwise a ConfigError says so up front.
:func:`host_batches` yields plain numpy sub-batches for code that places data itself.

Variable-length raw records (``decode=False``, or an LMDB of pickled/JPEG values):
``host_batches(loader, ragged="list")`` gives a list of per-sample arrays,
``ragged="pad"`` a ``(b, L)`` uint8 array padded with zeros plus the lengths;
``global_batches(loader, sharding, with_lengths=True)`` pads every record to the
dataset's longest (the same L on every process) and adds the global lengths array.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from .errors import ConfigError
from .loader import Loader

__all__ = ["global_batches", "host_batches", "to_global"]


def host_batches(
    loader: Loader, ragged: str = "list", pad_to: int | None = None
) -> Iterator[tuple[Any, ...]]:
    """``(data, labels)`` numpy sub-batches of this process, one per step.

    Parameters
    ----------
    ragged : {"list", "pad"}
        Variable-length raw records as a list of per-sample uint8 arrays (``"list"``),
        or a ``(b, L)`` padded uint8 array (``"pad"``, L = *pad_to* or the batch's
        longest record); with ``"pad"`` each item is ``(data, labels, lengths)``.
    """
    if ragged not in ("list", "pad"):
        raise ConfigError(f"ragged must be 'list' or 'pad', not {ragged!r}")
    for b in loader:
        if ragged == "pad":
            data, lengths = b.padded(pad_to) if b.ragged else (b.data, b.lengths)
            yield data, b.labels, lengths
        else:
            yield (b.samples() if b.ragged else b.data), b.labels


def to_global(local: np.ndarray, sharding: Any, global_rows: int):
    """A global ``jax.Array`` of *global_rows* rows from this process's rows *local*.

    Parameters
    ----------
    local : numpy.ndarray
        This process's contiguous block of rows (feedline's sub-batch).
    sharding : jax.sharding.Sharding
        How the global array is laid out over the devices (batch axis first).
    global_rows : int
        Rows of the global array (the global batch).
    """
    import jax

    shape = (int(global_rows), *np.shape(local)[1:])
    return jax.make_array_from_process_local_data(sharding, np.asarray(local), shape)


def global_batches(
    loader: Loader, sharding: Any, with_lengths: bool = False
) -> Iterator[tuple[Any, ...]]:
    """``(data, labels)`` as global ``jax.Array`` s, one pair per step.

    Parameters
    ----------
    loader : Loader
        Built with the same communicator as the JAX processes (rank = process index).
    sharding : jax.sharding.Sharding
        Sharding of the batch axis over the job's devices.
    with_lengths : bool
        Also yield the global int64 ``lengths`` array; variable-length raw records are
        then padded with zeros to the dataset's longest record (same on every process).

    Raises
    ------
    ConfigError
        When sub-batches would be unequal (B not divisible by the ranks, or a last
        partial step without ``drop_last``), or records are variable-length and
        *with_lengths* is False.
    """
    B, P = loader.batch_size, loader.world.size
    if B % P:
        raise ConfigError(
            f"global batch {B} does not divide among {P} processes; JAX needs equal shards"
        )
    if not loader.drop_last and loader.n % B:
        raise ConfigError(
            "the last step is partial: pass drop_last=True to the Loader for JAX global arrays"
        )
    longest = int(loader.dataset.index.lengths.max(initial=0))
    for b in loader:
        local = b.data
        if b.ragged:
            if not with_lengths:
                raise ConfigError(
                    "variable-length raw records cannot form one global array: pass "
                    "with_lengths=True (records padded to the longest, plus lengths)"
                )
            local, _ = b.padded(longest)
        data = to_global(local, sharding, B)
        labels = None if b.labels is None else to_global(b.labels, sharding, B)
        if with_lengths:
            yield data, labels, to_global(np.asarray(b.lengths, np.int64), sharding, B)
        else:
            yield data, labels
