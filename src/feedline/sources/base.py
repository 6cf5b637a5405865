# SPDX-License-Identifier: Apache-2.0
"""The source protocol: what brings one rank's raw records for each step.

A *source* executes a plan's reads for one rank and hands back, per step, the rank's
sub-batch as raw bytes (:class:`RawBatch`). The Loader owns ordering, decoding,
prefetching and state; a source owns only *how bytes arrive* (which rank reads, with
which calls, into which buffers). Sources are registered by name, and each preset
names the source that runs it, so the LMDB-specific executors (liblmdb cursors, node
windows, DM speculation, staggering) plug into the same Loader.

Contract, in the order the Loader calls it::

    src = SOURCES[name](ctx)         # once per Loader
    src.start(plan, first_step)      # once per epoch (or resume)
    src.anticipate(next_plan)        # optional: the plan that probably follows
    src.get(step)                    # first_step, first_step+1, ... in order
    src.finish()                     # every step delivered (or src.stop(): dropped early)
    src.stats(); src.close()

``get`` is called from one thread at a time (the Loader's producer, or the consumer
when ``threaded`` is True, i.e. the source runs its own I/O thread and buffers). To
end a pass the Loader calls ``request_stop`` (from any thread: a ``get`` blocked on
peers or tokens must then return promptly by raising :class:`SourceStopped`), joins
its producer, and then calls ``stop``.

*Anticipation* hides the first read of an epoch. The Loader tells a started source the
plan it expects next (``anticipate``: a callable, since making a plan costs
milliseconds); once the current pass's reads are done and a buffer is free, a source
may read that plan's first batch in the background and keep it across ``finish``.
The next ``start`` uses it only if it holds exactly the records the new plan starts
with (plans are pure, so a ``set_epoch`` or ``load_state_dict`` that changes the order
simply discards it); ``stop`` and ``close`` cancel it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..dist.alarm import Interrupted
from ..errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from ..dataset import Dataset
    from ..pipeline.options import PipelineOptions
    from ..plan.plan import Plan


class SourceStopped(Interrupted):
    """Raised inside a source's ``get`` when the Loader stops it (never reaches users).
    Waits for peers interrupted by the stop flag raise the base class,
    :class:`~feedline.dist.alarm.Interrupted`, which the Loader treats the same."""


@dataclass(slots=True)
class RawBatch:
    """One rank's records for one step: concatenated bytes, lengths and global ids."""

    ids: np.ndarray
    data: np.ndarray
    lengths: np.ndarray

    @classmethod
    def empty(cls) -> RawBatch:
        z = np.zeros(0, dtype=np.int64)
        return cls(z, np.zeros(0, dtype=np.uint8), z)


@dataclass
class SourceContext:
    """What a source may use: the dataset, this rank's place, options and a World.

    Attributes
    ----------
    dataset : Dataset
    rank, size : int
        This rank and the world size.
    options : PipelineOptions
    world : object or None
        The :class:`feedline.dist.world.World` when running under MPI (node windows,
        tokens); None for a single process or a torch.distributed world.
    memory_cap : int
        Bytes per node.
    ranks_per_node : int
        Ranks sharing this rank's node (the memory cap is shared by them).
    extra : dict
        Preset-specific options a source may read (unknown to the Loader).
    """

    dataset: Dataset
    rank: int
    size: int
    options: PipelineOptions
    world: Any = None
    memory_cap: int = 0
    ranks_per_node: int = 1
    extra: dict[str, Any] = field(default_factory=dict)


class Source(ABC):
    """Brings one rank's raw records, step by step. See the module docstring."""

    #: registry name
    name: ClassVar[str] = ""
    #: True when the source runs its own I/O thread and buffers (the Loader then calls
    #: ``get`` from the consumer and adds no read-ahead of its own)
    threaded: ClassVar[bool] = False

    def __init__(self, ctx: SourceContext) -> None:
        self.ctx = ctx

    @abstractmethod
    def start(self, plan: Plan, first_step: int) -> None:
        """Prepare to deliver steps ``first_step, ...`` of *plan* for ``ctx.rank``."""

    @abstractmethod
    def get(self, step: int) -> RawBatch:
        """The rank's raw sub-batch of *step* (called in step order)."""

    def anticipate(self, next_plan: Callable[[], Plan]) -> None:  # noqa: B027 - optional hook
        """*next_plan()* is the plan expected after this pass (see the module docstring)."""

    def finish(self) -> None:
        """Every step of the pass was delivered; by default the same as :meth:`stop`."""
        self.stop()

    def request_stop(self) -> None:  # noqa: B027 - optional hook
        """Ask a blocked ``get`` to give up (any thread); ``stop`` follows."""

    def stop(self) -> None:  # noqa: B027 - optional hook
        """Abandon the current epoch: cancel reads, join threads; ``start`` may follow."""

    @abstractmethod
    def stats(self) -> dict[str, Any]:
        """Counters: ``storage_bytes``, ``storage_ops``, ``io_s``, ``buffer_bytes`` ..."""

    def memory_bytes(self, plan: Plan) -> int:
        """Bytes this rank's source holds at most for *plan* (for the memory cap)."""
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release threads, buffers and file descriptors."""


#: name -> Source class
SOURCES: dict[str, type[Source]] = {}
#: preset -> source name (presets not listed run on ``direct``)
PRESET_SOURCES: dict[str, str] = {}


def register_source(cls: type[Source], presets: tuple[str, ...] = ()) -> type[Source]:
    """Register *cls* under ``cls.name``, and as the source of *presets*."""
    if not cls.name:
        raise ValueError("a Source needs a name")
    SOURCES[cls.name] = cls
    for p in presets:
        PRESET_SOURCES[p] = cls.name
    return cls


def source_name_for(preset: str, explicit: str | None = None) -> str:
    """The source a preset runs on (``explicit`` overrides)."""
    _load()
    name = explicit or PRESET_SOURCES.get(preset, "direct")
    if name not in SOURCES:
        raise ConfigError(f"unknown source {name!r}; known: {sorted(SOURCES)}")
    return name


#: Every source feedline ships, by name: the module that defines and registers it. One
#: table, read lazily (a source module imports this one, never the reverse at import
#: time). A user-written source registers itself with :func:`register_source`.
SOURCE_MODULES: dict[str, str] = {
    "direct": "feedline.sources.direct",
    "grouped": "feedline.sources.grouped",
    "node": "feedline.sources.node",
    "store": "feedline.sources.store",
    "lmdbio": "feedline.sources.lmdbio",
}


def _load() -> None:
    """Import every shipped source (once). No fallback: a source that cannot be imported
    is a broken install, and the error says so."""
    import importlib

    for name, module in SOURCE_MODULES.items():
        if name in SOURCES:
            continue
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(
                f"feedline's {name!r} source ({module}) cannot be imported: {e}. The "
                "installation is incomplete: reinstall feedline (pip install feedline, or "
                "dev/setup in a checkout) so that its native core feedline._core is built"
            ) from e
