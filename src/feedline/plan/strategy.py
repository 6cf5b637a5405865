# SPDX-License-Identifier: Apache-2.0
"""Strategy: the orthogonal knobs of a data-loading configuration, and the named presets.

A :class:`Strategy` is pure data (frozen, hashable, JSON-friendly through
:meth:`Strategy.to_dict`); the planner, the engine and the loader read the knobs they
need. Presets name the configurations of the five papers (docs/planner.md, "Presets");
:func:`get_strategy` returns a preset with some knobs overridden.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import ConfigError

Assignment = Literal["strided", "skip", "contiguous", "global", "chunk", "memory", "window"]
ChunkLayout = Literal["column", "rank"]
Region = Literal["rank", "node"]
Locate = Literal["seek", "speculative", "index"]
ReadMethod = Literal["mmap", "pread", "odirect", "pread-random"]
Store = Literal["off", "ordered", "opportunistic", "auto"]

ASSIGNMENTS = ("strided", "skip", "contiguous", "global", "chunk", "memory", "window")
_MiB = 1 << 20


#: knobs in bytes: a number, or a size with a unit ("64MiB", "2.5e9"; units.parse_bytes)
_BYTE_KNOBS = ("chunk_bytes", "window_bytes", "coalesce_bytes", "coalesce_gap")
#: knobs that count samples, steps or rounds
_COUNT_KNOBS = ("chunk", "window_steps", "stagger", "prefetch_depth", "load_rounds")


def _coerce_counts(st: Strategy) -> None:
    """Sizes given with a unit become bytes; a count that is not a whole number is a
    ConfigError naming the knob (not a TypeError from a comparison later)."""
    from ..units import parse_bytes

    for name in _BYTE_KNOBS + _COUNT_KNOBS:
        v = getattr(st, name)
        if isinstance(v, bool):
            raise ConfigError(f"{name} must be a whole number, not {v!r}")
        if not isinstance(v, numbers.Integral):
            if name in _BYTE_KNOBS and isinstance(v, str | numbers.Real):
                v = parse_bytes(v if isinstance(v, str) else float(v), name)
            elif isinstance(v, numbers.Real) and float(v).is_integer():
                v = int(float(v))
            else:
                raise ConfigError(f"{name} must be a whole number, not {v!r}")
        object.__setattr__(st, name, int(v))


@dataclass(frozen=True, slots=True)
class Strategy:
    """The knobs of a data-loading strategy (docs/planner.md, "Presets").

    Parameters
    ----------
    assignment : {"strided", "skip", "contiguous", "global", "chunk", "memory"}
        Which samples each step and rank get (see ``docs/planner.md``).
    chunk : int
        Group size in samples for ``chunk`` (the async-I/O paper's buffer B) and the unit
        loaded per round for ``memory``; 0 chooses automatically.
    chunk_layout : {"column", "rank"}
        ``column``: world-size independent order, each rank consumes whole groups one
        sample per step per batch column (feedline). ``rank``: each rank owns a
        contiguous share of the shuffled groups, exactly the async-I/O paper's pattern
        (depends on the world size).
    chunk_bytes : int
        ``chunk`` with the ``column`` layout: adjacent batch columns share contiguous
        tiles (sub-tiles of 8 columns, each shuffled locally), with g sized so that a
        node's share of a tile is about this many bytes (by the records' mean length):
        reads of this size whatever the group size the RL floor allows. 0: one group per
        column. Needs record lengths (ignored for plans of a bare count). See
        docs/planner.md, "Tiles".
    region : {"rank", "node"}
        ``contiguous`` and ``window``: one region per rank (MPI-Caffe) or per node,
        consumed step by step by the node's ranks, so that a node's future steps are one
        contiguous run (what LMDBIO's coalesced reads need, §4.5).
    window_bytes : int
        ``window``: bytes of a unit's reads shuffled together (one window); 0: as many
        as the memory cap holds twice. ``chunk_bytes`` is then the tile size (``chunk``,
        records per tile, wins when set).
    window_steps : int
        ``window``: steps per window, fixed (0: derived from ``window_bytes`` and the
        cap). The cost model sets it, with ``chunk``, so that the order no longer depends
        on the memory cap (a resumed job with another cap gets the same order).
    memory_fraction : float
        DeepIO's R: the fraction of the dataset held in memory per round (``memory``).
    load_rounds : int
        The DeepIO store at R = 1 (``memory`` with ``store`` ordered or opportunistic):
        K > 1 loads the dataset in about K rounds (whole units) in the first epoch
        (epoch 0 is ``memory(1/K)``'s order, so its first batch waits for 1/K of the
        load and the rest loads while it is served); every round stays in memory and the
        later epochs are full permutations from memory (``docs/deepio.md``, "Progressive
        first epoch"). 0 or 1: the whole dataset loads before the first batch. The cost
        model sets it for the ``feedline`` preset.
    readers_per_node : int or None
        k reader ranks per node filling a node shared-memory window; 0: every rank reads
        for itself; None: LMDBIO's rule (1 reader up to 16 ranks per node, 2 beyond).
    locate : {"seek", "speculative", "index"}
        How records are found: walk the LMDB tree at run time, LMDBIO-DM speculation,
        or seek-free from the index / provenance.
    read : {"mmap", "pread", "odirect", "pread-random"}
        The read system call family.
    coalesce_bytes : int
        Merge the extents of future steps into reads of at least this many bytes,
        under the memory cap; 0 disables coalescing.
    coalesce_gap : int
        Largest hole (bytes) read through when merging neighbouring extents (e.g. LMDB
        page headers between records).
    sample_reads : bool
        One read per sample, never merging neighbours (TF's per-sample reads).
    stagger : int
        Reader group size n for I/O staggering (n tokens, one group reads at a time);
        0 disables staggering.
    prefetch_depth : int
        Batches read ahead of the consumer: 0 synchronous, 1 one buffer filled by an
        I/O thread, 2 double buffering, d > 2 a prefetch queue.
    store : {"off", "ordered", "opportunistic", "auto"}
        DeepIO distributed in-memory store: ``ordered`` and ``opportunistic`` run the
        Loader on the store source (``off`` on a ``deepio-*`` preset reads from storage
        every epoch instead, same order); ``opportunistic`` also places each round of the
        ``memory`` assignment locality first (``docs/deepio.md``); ``auto`` (the
        ``feedline`` preset) lets the cost model choose the store when it is cheaper
        over the job's epochs (the Loader's ``epochs=``; 3 when unknown:
        :func:`feedline.plan.store_cost.store_candidate`).
    circular : bool
        Caffe's circular reading: the last step is filled by wrapping to the start of
        the epoch's order (not exactly-once; never the default).
    rl_floor : float
        Minimum DeepIO randomization level when the chunk size is chosen automatically.
    auto : bool
        The cost model (:func:`feedline.plan.cost.choose`) picks who reads, the tile and
        the window for the job, the dataset and the storage profile (the ``feedline``
        preset); the plan carries the chosen strategy.
    """

    assignment: Assignment = "strided"
    chunk: int = 0
    chunk_layout: ChunkLayout = "column"
    chunk_bytes: int = 0
    region: Region = "rank"
    window_bytes: int = 0
    window_steps: int = 0
    memory_fraction: float = 1.0
    load_rounds: int = 0
    readers_per_node: int | None = 0
    locate: Locate = "index"
    read: ReadMethod = "pread"
    coalesce_bytes: int = 0
    coalesce_gap: int = 0
    sample_reads: bool = False
    stagger: int = 0
    prefetch_depth: int = 0
    store: Store = "off"
    circular: bool = False
    rl_floor: float = 0.0
    auto: bool = False

    def __post_init__(self) -> None:
        if self.assignment not in ASSIGNMENTS:
            raise ConfigError(
                f"unknown assignment {self.assignment!r}; known: {', '.join(ASSIGNMENTS)}"
            )
        if self.chunk_layout not in ("column", "rank"):
            raise ConfigError(f"chunk_layout must be 'column' or 'rank', not {self.chunk_layout!r}")
        if self.region not in ("rank", "node"):
            raise ConfigError(f"region must be 'rank' or 'node', not {self.region!r}")
        if self.locate not in ("seek", "speculative", "index"):
            raise ConfigError(f"locate must be seek, speculative or index, not {self.locate!r}")
        if self.read not in ("mmap", "pread", "odirect", "pread-random"):
            raise ConfigError(
                f"read must be mmap, pread, odirect or pread-random, not {self.read!r}"
            )
        if self.store not in ("off", "ordered", "opportunistic", "auto"):
            raise ConfigError(
                f"store must be off, ordered, opportunistic or auto, not {self.store!r}"
            )
        _coerce_counts(self)
        for name in (
            "chunk",
            "chunk_bytes",
            "window_bytes",
            "window_steps",
            "coalesce_bytes",
            "coalesce_gap",
            "stagger",
            "prefetch_depth",
            "load_rounds",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.readers_per_node is not None and self.readers_per_node < 0:
            raise ConfigError("readers_per_node must be >= 0 or None")
        if not 0.0 < self.memory_fraction <= 1.0:
            raise ConfigError(f"memory_fraction must be in (0, 1], got {self.memory_fraction}")
        if not 0.0 <= self.rl_floor <= 1.0:
            raise ConfigError(f"rl_floor must be in [0, 1], got {self.rl_floor}")

    @property
    def seeks(self) -> bool:
        """True when records are located at run time (the sidecar index is not used)."""
        return self.locate != "index"

    @property
    def aggregated(self) -> bool:
        """True when a few readers per node fill a node shared-memory window."""
        return self.readers_per_node != 0

    def readers_for(self, ranks_on_node: int) -> int:
        """Reader ranks on a node of *ranks_on_node* ranks (k; every rank when 0)."""
        k = self.readers_per_node
        if k is None:  # LMDBIO §4.1: one root suffices up to 16 cores, two beyond
            k = 1 if ranks_on_node <= 16 else 2
        if k == 0:
            return ranks_on_node
        return max(1, min(k, ranks_on_node))

    def replace(self, **changes: Any) -> Strategy:
        """A copy with *changes* applied (validated)."""
        retired = set(changes) & set(RETIRED)
        if retired:
            k = sorted(retired)[0]
            raise ConfigError(f"strategy knob {k!r} was removed: {RETIRED[k]}")
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(
                f"unknown strategy knob(s) {sorted(unknown)}; known: "
                f"{[f.name for f in dataclasses.fields(self)]}"
            )
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The knobs as a plain dict (for loader state and JSON)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Strategy:
        """Inverse of :meth:`to_dict` (knobs since removed, in older states, are dropped:
        they never changed what was delivered)."""
        return cls().replace(**{k: v for k, v in d.items() if k not in RETIRED})


#: Knobs that were removed, and why (they changed nothing that was delivered).
RETIRED: dict[str, str] = {
    "io_thread": "reads run on a loader thread whenever prefetch_depth >= 1 "
    "(1: one buffer filled by an I/O thread, the async-I/O paper's; 2: double buffering)",
    "own_lock": "every liblmdb reader opens read-only with lock=False (no lock file at all)",
}

_LMM = Strategy(assignment="strided", readers_per_node=None, locate="seek", read="mmap")
_COAL = 8 * _MiB
_COALESCED = _LMM.replace(
    assignment="contiguous",
    region="node",
    locate="index",
    read="pread",
    coalesce_bytes=_COAL,
    coalesce_gap=64 << 10,
)
_ASYNC = Strategy(
    assignment="chunk", chunk_layout="rank", read="pread", coalesce_gap=4096, prefetch_depth=1
)

#: Every preset (docs/planner.md, "Presets"), with the paper row it reproduces (also in PRESET_DOCS).
PRESETS: dict[str, Strategy] = {
    # LMDBIO journal §3: Caffe/LMDB, every rank walks a liblmdb cursor over mmap.
    "lmdb": Strategy(assignment="strided", readers_per_node=0, locate="seek", read="mmap"),
    # LMDBIO §4.1-4.6, cumulative.
    "lmm": _LMM,
    "lmm-dm": _LMM.replace(locate="speculative"),
    "lmm-dio": _LMM.replace(read="pread"),
    "lmm-dio-prov": _LMM.replace(locate="index", read="pread"),
    # COAL: each root reads one contiguous chunk holding many future steps, so a node's
    # steps must be adjacent in the file: one region per node (§4.5).
    "lmm-dio-prov-coal": _COALESCED,
    "lmm-dio-prov-coal-stag": _COALESCED.replace(stagger=4),
    # MPI-Caffe on FEFS: read one, skip P-1 (original) vs one contiguous region per rank.
    "skip": Strategy(assignment="skip", locate="seek", read="mmap"),
    "contiguous": Strategy(assignment="contiguous", locate="seek", read="mmap"),
    # Asynchronous-I/O paper §IV: TF per-sample reads, TF with prefetch, Async I/O (one
    # buffer, I/O thread), Async I/O with double buffering.
    "tf": Strategy(assignment="global", sample_reads=True, read="pread"),
    "tf-pre": Strategy(assignment="global", sample_reads=True, read="pread", prefetch_depth=2),
    "async": _ASYNC,
    "async-db": _ASYNC.replace(prefetch_depth=2),
    # DeepIO: in-memory store, global permutation over what is in memory each round.
    "deepio-ordered": Strategy(
        assignment="memory", store="ordered", read="pread", prefetch_depth=2
    ),
    "deepio-opportunistic": Strategy(
        assignment="memory", store="opportunistic", read="pread", prefetch_depth=2
    ),
    # feedline: the cost model (plan/cost.py) picks who reads (every rank, or one reader
    # per node into a shared window), the tile and the window for the job and storage;
    # tiles in keyed order, each unit's windows fully shuffled, read in tile-sized
    # extents, double buffered. These knobs are the starting point it fills in.
    "feedline": Strategy(
        assignment="window",
        region="node",
        chunk_bytes=8 * _MiB,
        readers_per_node=1,
        locate="index",
        read="odirect",
        coalesce_bytes=_COAL,
        coalesce_gap=64 << 10,
        prefetch_depth=2,
        store="auto",
        rl_floor=0.9,
        auto=True,
    ),
}

PRESET_DOCS: dict[str, str] = {
    "lmdb": "Caffe/LMDB (LMDBIO §3): every rank seeks with a liblmdb cursor over mmap",
    "lmm": "LMDBIO-LMM (§4.1): k root readers per node via mmap into a node shared window",
    "lmm-dm": "LMDBIO-LMM-DM (§4.2): + portable cursors, speculative parallel prefetch",
    "lmm-dio": "LMDBIO-LMM-DIO (§4.3): one process seeks, roots read with pread",
    "lmm-dio-prov": "LMDBIO-LMM-DIO-PROV (§4.4): seek-free offsets from provenance",
    "lmm-dio-prov-coal": "LMDBIO-...-COAL (§4.5): one region per node; each root reads many future steps in one contiguous read under the memory cap",
    "lmm-dio-prov-coal-stag": "LMDBIO-...-STAG (§4.6): + I/O staggering by token passing",
    "skip": "MPI-Caffe original: rank r reads records r, r+P, ... (read one, skip P-1)",
    "contiguous": "MPI-Caffe improved: each rank reads its own contiguous region",
    "tf": "Async-I/O paper 'TF': global shuffle, one read per sample, no prefetch",
    "tf-pre": "Async-I/O paper 'TF-Pre': global shuffle, one read per sample, prefetch",
    "async": "Async-I/O paper 'Async I/O': shuffled contiguous groups, I/O thread, one buffer",
    "async-db": "Async-I/O paper 'Async I/O (DB)': + double buffering",
    "deepio-ordered": "DeepIO-Base: in-memory store, ordered mode",
    "deepio-opportunistic": "DeepIO-Opp: in-memory store, entropy-aware opportunistic ordering",
    "feedline": "feedline default: large tiles in random order, each node's (or rank's) windows shuffled in memory; who reads, tile and window chosen by a cost model, or the DeepIO store when the dataset fits in the job's memory and pays within the job's epochs (epochs=, else 3)",
}


def get_strategy(name: str | Strategy = "feedline", **overrides: Any) -> Strategy:
    """The strategy of preset *name* with *overrides* applied.

    Parameters
    ----------
    name : str or Strategy
        A key of :data:`PRESETS`, an assignment name (``"global"``, ``"chunk"``, ...:
        the default knobs with that assignment), or a Strategy.
    **overrides
        Knobs to change, e.g. ``get_strategy("lmm", readers_per_node=2)``.

    Raises
    ------
    ConfigError
        Unknown preset or knob, or an invalid value.
    """
    if isinstance(name, Strategy):
        base = name
    elif name in ASSIGNMENTS and name not in PRESETS:
        base = Strategy(assignment=name)  # type: ignore[arg-type]
    else:
        try:
            base = PRESETS[name]
        except KeyError:
            raise ConfigError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}") from None
    return base.replace(**overrides) if overrides else base
