"""JAX adapter: host-local feedline batches, and global arrays across processes.

In a multi-process JAX job every process (= feedline rank) holds its own part of the
global batch; :func:`global_batches` turns each step's sub-batches into one global
``jax.Array`` with ``jax.make_array_from_process_local_data``. JAX needs equal shards,
so the global batch must divide evenly among the processes and the last partial step
must be dropped (``drop_last=True``); otherwise a ConfigError says so up front.
:func:`host_batches` yields plain numpy sub-batches for code that places data itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from .errors import ConfigError
from .loader import Loader

__all__ = ["global_batches", "host_batches", "to_global"]


def host_batches(loader: Loader) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
    """``(data, labels)`` numpy sub-batches of this process, one per step."""
    for b in loader:
        yield b.data, b.labels


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


def global_batches(loader: Loader, sharding: Any) -> Iterator[tuple[Any, Any]]:
    """``(data, labels)`` as global ``jax.Array`` s, one pair per step.

    Parameters
    ----------
    loader : Loader
        Built with the same communicator as the JAX processes (rank = process index).
    sharding : jax.sharding.Sharding
        Sharding of the batch axis over the job's devices.

    Raises
    ------
    ConfigError
        When sub-batches would be unequal (B not divisible by the ranks, or a last
        partial step without ``drop_last``).
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
    for b in loader:
        data = to_global(b.data, sharding, B)
        labels = None if b.labels is None else to_global(b.labels, sharding, B)
        yield data, labels
