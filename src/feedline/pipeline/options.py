# SPDX-License-Identifier: Apache-2.0
"""The Loader's options, grouped in small frozen dataclasses with documented defaults.

Every default comes from :mod:`feedline.defaults`, so each has a ``FEEDLINE_*``
environment override. Options the Loader does not know are strategy knobs
(:class:`feedline.plan.strategy.Strategy`) and are validated there.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .. import defaults
from ..errors import ConfigError
from ..units import parse_bytes


@dataclass(frozen=True, slots=True)
class BufferSize:
    """The async-I/O paper's buffer B, in samples or in bytes (exactly one is set).

    Parameters
    ----------
    samples : int
        B in samples (0: unset).
    nbytes : int
        B in bytes (0: unset); converted to samples with the mean record length.
    """

    samples: int = 0
    nbytes: int = 0

    @classmethod
    def parse(cls, value: int | str | BufferSize) -> BufferSize:
        """An int is samples; a string with a unit (``"32MiB"``) is bytes."""
        if isinstance(value, BufferSize):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 1:
                raise ConfigError(f"buffer must be >= 1 sample, got {value}")
            return cls(samples=value)
        s = str(value).strip()
        if s.isdigit():
            return cls.parse(int(s))
        nbytes = parse_bytes(s, "buffer")
        if nbytes < 1:
            raise ConfigError(f"buffer must be positive, got {value!r}")
        return cls(nbytes=nbytes)

    def in_samples(self, mean_record_bytes: float) -> int:
        """B in samples for records of *mean_record_bytes* (at least 1)."""
        if self.samples:
            return self.samples
        return max(1, int(self.nbytes // max(1.0, mean_record_bytes)))


@dataclass(frozen=True, slots=True)
class PipelineOptions:
    """How the Loader runs: threads, read-ahead and ordering.

    Parameters
    ----------
    shuffle : bool
        False gives the evaluation order: ``strided`` (records in file order), no
        shuffle, every sample once (default True).
    prefetch_depth : int or None
        Batches prepared ahead of the consumer; None takes the preset's (2 = double
        buffering for ``feedline``; 0 for ``tf``). ``FEEDLINE_PREFETCH_DEPTH`` overrides
        it for presets that prefetch.
    workers : int
        Threads that decode and run ``transform`` on prefetched batches
        (``FEEDLINE_WORKERS``, default 1).
    io_threads : int
        Native I/O threads per reader (``FEEDLINE_IO_THREADS``, default 4).
    sample_threads : int
        Threads reading one sample each for ``tf-pre`` (tf.data's AUTOTUNE thread
        pool; ``FEEDLINE_SAMPLE_THREADS``, default: the number of CPUs).
    buffer : BufferSize or None
        The async-I/O buffer B (``async``/``async-db``; ``FEEDLINE_ASYNC_BUFFER``,
        default ``32MiB``); None: the strategy's ``chunk``.
    nodes : int
        Emulated nodes (``FEEDLINE_NODES``; 0: real nodes from MPI).
    timeout_s : float
        Longest wait for one batch before the consumer reports a stall (0: forever).
    epochs : int or None
        Epochs the job means to read, told to the ``feedline`` preset's cost model: the
        DeepIO store (which pays its load in the first epoch) is weighed over that many
        (None: unknown, 3), and nothing is read ahead for the epoch after the last one.
        A hint, not a limit: the Loader reads as many as asked.
    """

    shuffle: bool = True
    prefetch_depth: int | None = None
    workers: int = 1
    io_threads: int = 4
    sample_threads: int = 2
    buffer: BufferSize | None = None
    nodes: int = 0
    timeout_s: float = 0.0
    epochs: int | None = None

    def __post_init__(self) -> None:
        for name in ("workers", "io_threads", "sample_threads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.prefetch_depth is not None and self.prefetch_depth < 0:
            raise ConfigError(f"prefetch_depth must be >= 0, got {self.prefetch_depth}")
        if self.nodes < 0:
            raise ConfigError(f"nodes must be >= 0, got {self.nodes}")
        if self.timeout_s < 0:
            raise ConfigError(f"timeout_s must be >= 0, got {self.timeout_s}")
        e = self.epochs
        if e is not None and (isinstance(e, bool) or not isinstance(e, int) or e < 1):
            raise ConfigError(f"epochs must be an int >= 1 or None, got {e!r}")


_FIELDS = {f.name for f in dataclasses.fields(PipelineOptions)}


def pipeline_options(options: dict[str, Any]) -> tuple[PipelineOptions, dict[str, Any]]:
    """Split the Loader's ``**options`` into PipelineOptions and the rest (strategy knobs).

    Defaults come from :mod:`feedline.defaults` (environment first).
    """
    mine = {k: options[k] for k in options if k in _FIELDS}
    rest = {k: v for k, v in options.items() if k not in _FIELDS}
    kw: dict[str, Any] = {
        "workers": defaults.get("workers"),
        "io_threads": defaults.get("io_threads"),
        "sample_threads": defaults.get("sample_threads") or _cpus(),
        "nodes": defaults.get("nodes"),
    }
    kw.update(mine)
    if kw.get("buffer") is not None:
        kw["buffer"] = BufferSize.parse(kw["buffer"])
    try:
        return PipelineOptions(**kw), rest
    except TypeError as e:  # wrong types for a field
        raise ConfigError(f"invalid loader option: {e}") from None


def default_read(files: list[str], epochs: int | None, store: bool = False) -> str:
    """The ``feedline`` preset's read method. ``odirect`` when the DeepIO store holds
    the data (*store*: it keeps what it loads, so a page-cache copy would hold it twice),
    when the job reads its data once (``epochs=1``: no later epoch) or when this node's
    files are too big for its page cache to keep them until the next epoch
    (FEEDLINE_DIRECT_ABOVE, default RAM/2): caching them would only cost CPU and evict
    other data. Else buffered ``pread-random`` (the kernel's read-ahead off: tiles are
    large and scattered, and read-ahead past their ends is bandwidth spent on bytes
    nobody asked for), so later epochs read memory."""
    import os

    if store or epochs == 1:
        return "odirect"
    try:
        total = sum(os.path.getsize(f) for f in files)
    except OSError:
        return "odirect"
    return "odirect" if total > int(defaults.get("direct_above")) else "pread-random"


def default_buffer() -> BufferSize:
    """The async-I/O buffer when neither ``buffer=`` nor the strategy's chunk is given."""
    return BufferSize.parse(defaults.get("async_buffer"))


def _cpus() -> int:
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)
