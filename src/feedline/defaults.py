# SPDX-License-Identifier: Apache-2.0
"""One place for feedline's defaults: the only reader of ``FEEDLINE_*`` variables.

``defaults.get("memory_cap")`` returns, in this order: a value given to
:func:`set` (process-wide, or inside its ``with`` block), ``FEEDLINE_MEMORY_CAP`` from
the environment, or the built-in default. Values are parsed and checked against the
type of the default (sizes also take units: ``64MB``, ``2GiB``). Every knob, its
variable and its meaning: :func:`describe`, and the table in docs/loader.md.

>>> from feedline import defaults
>>> with defaults.set(io_threads=8, memory_cap="1GiB"):
...     defaults.get("io_threads")
8
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

_GiB = 1 << 30


def _node_ram() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # pragma: no cover - non-POSIX
        return 16 * _GiB


@dataclass(frozen=True)
class _Knob:
    default: Any
    doc: str


KNOBS: dict[str, _Knob] = {
    "memory_cap": _Knob(
        min(int(2.5 * 1e9), _node_ram() // 4),
        "bytes per node for readers' buffers, windows, index and prefetch "
        "(default: min(2.5 GB, RAM/4), divided among emulated nodes)",
    ),
    "nodes": _Knob(0, "emulated nodes (0: from COMM_TYPE_SHARED)"),
    "io_threads": _Knob(
        4,
        "native I/O threads per reading rank; a node reader (source='node') reads for its "
        "node's ranks with their total, at most 32",
    ),
    "io_method": _Knob("pread", "I/O engine read method: pread, odirect, mmap or pread-random"),
    "io_chunk_mib": _Knob(
        8, "largest single read of the I/O engine in MiB (longer extents are split)"
    ),
    "io_stage": _Knob(
        "auto",
        "a node window's O_DIRECT reads go through per-thread huge-page staging buffers and "
        "are copied in: auto (files on a local block device, ext4/xfs/btrfs, and shared "
        "memory on 4 KiB pages), on or off",
    ),
    "io_align": _Knob(0, "O_DIRECT alignment in bytes (0: from the file system, else 4096)"),
    "io_retries": _Knob(3, "retries of a transient I/O error (EIO...) before StorageError"),
    "io_retry_backoff_ms": _Knob(
        1.0, "first pause before retrying a transient I/O error, doubled per retry (1+2+4 ms)"
    ),
    "peer_timeout_s": _Knob(
        600.0,
        "longest wait for other ranks (tokens, collectives, node windows) when the Loader "
        "has no timeout_s; ranks on the same host that die are noticed within 0.5 s",
    ),
    "exit_grace_s": _Knob(
        10.0,
        "at exit after a failure, how long ranks wait for each other before MPI_Abort",
    ),
    "abort_delay_s": _Knob(
        0.5,
        "pause between printing why a job ends and MPI_Abort, so that the launcher "
        "forwards the message before it kills the processes",
    ),
    "abort_on_error": _Knob(
        1, "1: after a failure, abort the MPI job at exit instead of hanging in MPI_Finalize"
    ),
    "direct_above": _Knob(
        _node_ram() // 2,
        "the feedline preset reads with O_DIRECT when this node's dataset files exceed this "
        "many bytes (default RAM/2: the page cache cannot keep them for the next epoch), "
        "else with buffered pread",
    ),
    "prefetch_depth": _Knob(2, "batches read ahead of the consumer (2 = double buffering)"),
    "cache_dir": _Knob(
        os.path.join(os.path.expanduser("~"), ".cache", "feedline"),
        "where index sidecars go when the dataset directory is read-only",
    ),
    "unpack_cache_mib": _Knob(
        128,
        "MiB of recently unpacked compressed spans (HDF5 chunks, gzip segments) kept per "
        "dataset, so samples of one span in consecutive batches unpack it once (0: off)",
    ),
    "workers": _Knob(1, "loader threads decoding and transforming prefetched batches"),
    "sample_threads": _Knob(0, "threads reading one sample each for tf-pre (0: CPUs)"),
    "async_buffer": _Knob(
        "32MiB", "async-I/O buffer B for async/async-db (samples, or bytes with a unit)"
    ),
    "store_peer_timeout_s": _Knob(
        0.0,
        "the DeepIO store raises StorePeerDied when a wait for its peers lasts longer "
        "(0: never; peers on this host are checked for death without a timeout)",
    ),
    "poll_sleep_us": _Knob(200, "sleep between polls of a pending MPI request"),
    "store_shared_memory": _Knob(
        1,
        "the DeepIO store reads the parts of ranks on its host from MPI's shared memory "
        "directly (0: every get from another rank is an MPI_Rget)",
    ),
    "progress": _Knob(1, "show progress bars on long work (0 to hide)"),
    "dlio_preset": _Knob("feedline", "the Loader preset feedline.dlio.Loader runs under DLIO"),
    "mpiexec": _Knob("", "the mpiexec the bench harness launches (empty: beside Python, PATH)"),
    "fuse_bin": _Knob("", "the storage emulator's binary (empty: the installed one, PATH)"),
}


#: knobs that are byte sizes: ``FEEDLINE_MEMORY_CAP=64MB``, ``64MiB``, ``2G``, ``2.5e9``
_SIZES = ("memory_cap",)


#: values given to :func:`set`, innermost last (a stack: ``with`` blocks nest)
_OVERRIDES: list[dict[str, Any]] = []


def _knob(name: str) -> _Knob:
    try:
        return KNOBS[name]
    except KeyError:
        raise ConfigError(f"unknown feedline setting {name!r}; known: {sorted(KNOBS)}") from None


def _parse(name: str, raw: Any, where: str) -> Any:
    """*raw* (a string from the environment, or a value given to :func:`set`) as the
    knob's type; :class:`ConfigError` naming *where* it came from when it is not one."""
    kind = type(_knob(name).default)
    if name in _SIZES:
        from .units import parse_bytes

        return parse_bytes(raw, where)
    if isinstance(raw, bool) or (kind is not str and not isinstance(raw, str | int | float)):
        raise ConfigError(f"{where}={raw!r} is not a valid {kind.__name__}")
    try:
        if kind is int:
            value = float(raw)
            if not value.is_integer():
                raise ValueError
            return int(value)
        return kind(raw)
    except ValueError:
        raise ConfigError(f"{where}={raw!r} is not a valid {kind.__name__}") from None


def get(name: str) -> Any:
    """The effective value of knob *name*: :func:`set`, else the environment, else the
    default."""
    knob = _knob(name)
    for layer in reversed(_OVERRIDES):
        if name in layer:
            return layer[name]
    raw = os.environ.get("FEEDLINE_" + name.upper())
    if raw is None or raw == "":
        return knob.default
    return _parse(name, raw, f"FEEDLINE_{name.upper()}")


def origin(name: str) -> str:
    """Where :func:`get` takes *name* from: ``"set"``, ``"environment"`` or ``"default"``."""
    _knob(name)
    if any(name in layer for layer in _OVERRIDES):
        return "set"
    return "environment" if os.environ.get("FEEDLINE_" + name.upper()) else "default"


class _Setting:
    """What :func:`set` returns: the new values are in force at once; used as a context
    manager, they end with the block (the previous ones come back)."""

    def __init__(self, layer: dict[str, Any]) -> None:
        self._layer = layer

    def __enter__(self) -> _Setting:
        return self

    def __exit__(self, *exc: object) -> None:
        for i in range(len(_OVERRIDES) - 1, -1, -1):
            if _OVERRIDES[i] is self._layer:
                del _OVERRIDES[i]
                break


def set(values: dict[str, Any] | None = None, /, **knobs: Any) -> _Setting:
    """Set knobs for this process, over the environment: ``defaults.set(io_threads=8)``
    or ``defaults.set({"io_threads": 8})``; ``with defaults.set(...):`` limits them to
    the block. Values are checked like the environment's (:class:`ConfigError`)."""
    layer = {**(values or {}), **knobs}
    checked = {k: _parse(k, v, k) for k, v in layer.items()}
    _OVERRIDES.append(checked)
    return _Setting(checked)


def reset() -> None:
    """Drop every value given to :func:`set` (the environment and defaults remain)."""
    _OVERRIDES.clear()


def describe() -> str:
    """A table of every knob, its effective value and its environment variable."""
    lines = []
    for name, knob in KNOBS.items():
        lines.append(f"FEEDLINE_{name.upper():<20} = {get(name)!s:<24} {knob.doc}")
    return "\n".join(lines)
