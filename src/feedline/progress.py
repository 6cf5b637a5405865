# SPDX-License-Identifier: Apache-2.0
"""Progress bars for long work (index builds, dataset generation), over tqdm.

A bar is shown only where someone can read it: on MPI rank 0 (or the only process),
when stderr is a terminal, and when ``FEEDLINE_PROGRESS`` is not 0. Hidden bars are
tqdm's own no-op bars, so callers use one code path (iterate, ``update``, ``close``,
``with``) whether or not anything is drawn. The rank is read from an already initialised
MPI (:func:`feedline.dist.ops.world_rank`), else from the launcher's environment by
:func:`feedline.dist.launch.detect` (MPICH, Open MPI, PMIx, srun, torchrun): a progress
bar never initialises MPI.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from tqdm import tqdm

from . import defaults
from .dist.launch import rank_from_env
from .dist.ops import world_rank


def process_rank() -> int:
    """This process's global rank (0 when not launched in parallel).

    Uses MPI only when the program has already initialised it; else
    the launcher's rank from :func:`feedline.dist.launch.rank_from_env` (the same rule
    as the Loader's world: an srun task id counts inside an srun step only).
    """
    rank = world_rank()
    if rank is not None:
        return rank
    return rank_from_env()


def should_show(enabled: bool | None = None, stream: Any = None) -> bool:
    """Whether a bar would be drawn.

    Parameters
    ----------
    enabled : bool or None
        ``False`` hides; ``True`` shows even when *stream* is not a terminal; ``None``
        shows on terminals only.
    stream : file, optional
        Where the bar goes (default ``sys.stderr``).

    Notes
    -----
    ``FEEDLINE_PROGRESS=0`` hides every bar whatever the caller asks (the user's choice
    wins); ``FEEDLINE_PROGRESS=2`` shows bars on non-terminals too (CI logs). Ranks other
    than 0 never draw.
    """
    level = int(defaults.get("progress"))
    if level <= 0 or enabled is False or process_rank() != 0:
        return False
    if enabled or level >= 2:
        return True
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or unusual streams
        return False


def progress(
    iterable_or_total: Iterable[Any] | int | None,
    desc: str = "",
    enabled: bool | None = None,
    **kwargs: Any,
) -> tqdm:
    """A tqdm bar over an iterable, or a manual bar of ``total`` steps.

    Parameters
    ----------
    iterable_or_total : iterable or int or None
        Iterate over it through the bar, or (an int) the total for ``bar.update(n)``.
        ``None`` makes a bar of unknown total.
    desc : str
        Label shown before the bar.
    enabled : bool or None
        See :func:`should_show`.
    **kwargs
        Passed to :class:`tqdm.tqdm` (``unit="B", unit_scale=True`` for bytes, ...).

    Returns
    -------
    tqdm.tqdm
        Usable as an iterable, with ``update``/``close``, and as a context manager; a
        disabled bar does nothing and costs almost nothing.

    Examples
    --------
    >>> for batch in progress(batches, "writing"):
    ...     write(batch)
    >>> with progress(n_bytes, "reading", unit="B", unit_scale=True) as bar:
    ...     bar.update(len(chunk))
    """
    stream = kwargs.pop("file", None) or sys.stderr
    show = should_show(enabled, stream)
    kwargs.setdefault("dynamic_ncols", True)
    kwargs.setdefault("leave", False)
    if isinstance(iterable_or_total, int) or iterable_or_total is None:
        return tqdm(total=iterable_or_total, desc=desc, disable=not show, file=stream, **kwargs)
    return tqdm(iterable_or_total, desc=desc, disable=not show, file=stream, **kwargs)


__all__ = ["process_rank", "progress", "should_show"]
