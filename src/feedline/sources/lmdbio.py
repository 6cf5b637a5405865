# SPDX-License-Identifier: Apache-2.0
"""The LMDBIO and MPI-Caffe presets as one Loader source (LMDBIO journal §3-4, MPI-Caffe).

Who reads what, how and when, by preset (the strategy's knobs select it):

- ``lmdb``, ``skip``, ``contiguous`` — every rank is a reader and walks its own liblmdb
  cursor over mmap (read-only, no lock file) to its records: Caffe's strided order
  (initial seek of rank·B/P records, then a skip of (P-1)·B/P per step), MPI-Caffe's
  read-one-skip-(P-1), or each rank's own region.
- ``lmm`` (§4.1) — k readers per node (1 up to 16 ranks per node, 2 beyond; the
  ``readers_per_node`` knob) walk liblmdb cursors and copy their share of the node's
  records into a node shared-memory window; every rank copies its sub-batch out after
  one node meeting per step (a polled allgather that carries lengths and failures).
- ``lmm-dm`` (§4.2) — the readers guess the pages their records occupy from history,
  prefetch them with ``pread`` concurrently, then, one after another, receive the
  portable cursor (page numbers and slots) from the previous reader, walk the tree in
  memory with feedline's page parser, and send the final cursor on (nonblocking MPI,
  polled with sleeps). ``spec_*`` statistics say how much speculation read for nothing.
- ``lmm-dio`` (§4.3) — one process (the first reader) walks the tree for the records of
  the coming steps (a counted seek, one ``pread`` per page) and broadcasts their
  (offset, length); the readers read them with ``pread`` on the engine into the window.
- ``lmm-dio-prov`` (§4.4) — no walk at all: the extents come from provenance, which is
  feedline's index sidecar (derived once, by post-processing the file); readers read
  one extent per record.
- ``lmm-dio-prov-coal`` (§4.5) — each reader reads the planner's coalesced windows
  (many future steps, reads of at least ``coalesce_bytes`` under the node memory cap).
- ``lmm-dio-prov-coal-stag`` (§4.6) — the same, with readers in groups of n reading one
  group at a time: a reader reads only while holding its label's token, then passes it
  to the same label in the next group. n is the ``stagger`` knob when given, else half
  the readers (two groups).

On a dataset that is not an LMDB (binary records, HDF5, ...) there is no tree to walk:
the seeking presets keep their readers, node windows and order but locate records from
the index (mode ``index``), so MPI-Caffe's patterns can be compared on any file.

Each way of finding and reading records is a mode class in
:mod:`feedline.sources.lmdbio_modes` (``cursor``: the liblmdb presets, ``dm``, ``dio``,
``prov``: PROV/COAL/STAG, ``index``; ``stats()["mode"]`` names it); this module holds
what they share: the readers, the node window, the node meeting, the counters, the
staggering token. docs/lmdbio.md describes the presets, docs/architecture.md where
sources sit in the Loader.

All presets deliver the plan's samples, so presets with the same assignment deliver
identical bytes. The trade-off of running every preset synchronously (read, meet,
copy, step after step) is that nothing overlaps reading: this source measures the
papers' read paths, not feedline's best pipeline (that is the ``feedline`` preset).
Per-rank statistics: :meth:`LmdbioSource.stats`; all ranks: :func:`gather_stats`,
printed by :func:`stats_table`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import defaults
from ..dist import ops as mpi
from ..errors import FeedlineError
from ..pipeline.reader import ExtentReader, gather
from ..plan.layout import even_split, even_start
from .base import RawBatch, Source, SourceContext, register_source
from .lmdb_readers import new_counters
from .lmdbio_modes import MODES, _Failed, _Mode

PRESETS = (
    "lmdb",
    "lmm",
    "lmm-dm",
    "lmm-dio",
    "lmm-dio-prov",
    "lmm-dio-prov-coal",
    "lmm-dio-prov-coal-stag",
    "skip",
    "contiguous",
)


def _typed(exc: BaseException, path: str) -> BaseException:
    """A reader's open failure as a StorageError naming the file (lmdb.Error, OSError)."""
    import errno
    import os

    from ..errors import DatasetNotFoundError, StorageError

    if isinstance(exc, DatasetNotFoundError):
        # the file went away after the dataset was opened: a storage failure, as every
        # other source reports it (docs/reliability.md)
        return StorageError(exc.path, 0, errno.ENOENT, f"{exc.path} @ byte 0: {exc.reason}")
    if isinstance(exc, FeedlineError):
        return exc
    err = getattr(exc, "errno", None)
    if not isinstance(err, int) or err <= 0:
        err = errno.EIO if os.path.exists(path) else errno.ENOENT
    return StorageError(path, 0, err, f"{path} @ byte 0: cannot open: {type(exc).__name__}: {exc}")


def mode_of(strategy) -> str:
    """``cursor`` (liblmdb/mmap), ``dm``, ``dio`` (one locator, pread) or ``prov``: the
    mode a strategy's knobs select (``start`` runs ``index`` instead of the seeking
    modes on a dataset that is not an LMDB)."""
    if strategy.locate == "speculative":
        return "dm"
    if strategy.locate == "seek":
        return "cursor" if strategy.read == "mmap" else "dio"
    return "prov"


class LmdbioSource(Source):
    """Readers per the LMDBIO/MPI-Caffe presets; see the module docstring.

    What differs between presets lives in a mode object (``feedline.sources.lmdbio_modes``,
    one per mode name, kept for the source's life); this class holds what they share:
    the readers and this rank's place, the buffer, the node meeting, the counters, the
    staggering token, the engine, and the step path of every mode but PROV.
    """

    name = "lmdbio"
    #: the Loader keeps the strategy's ``stagger`` knob for this source (token passing)
    staggers = True

    def __init__(self, ctx: SourceContext) -> None:
        super().__init__(ctx)
        self.world = ctx.world
        self.c = new_counters()
        self._modes: dict[str, _Mode] = {}  # every mode started, by name
        self._mode: _Mode | None = None  # the current pass's
        self._engine: ExtentReader | None = None
        self._shm: Any = None
        self._buf: Any = None
        self._gen = 0  # passes started (tags DM's hand-off messages)
        self._token: Any = None
        self._stop_evt = threading.Event()  # interrupts waits for peers (request_stop)
        self._window_bytes = 0
        self._node_syncs = 0
        self._stagger_n = 0

    # ------------------------------------------------------------------ setup
    @property
    def _path(self) -> str:
        return self.ctx.dataset.files[0]

    def _engine_for(self, method: str) -> ExtentReader:
        if self._engine is None:
            self._engine = ExtentReader(
                self.ctx.dataset.files,
                self.ctx.options.io_threads,
                method,
                timeout_s=self.ctx.options.timeout_s,
            )
        return self._engine

    def start(self, plan, first_step: int) -> None:
        self.stop()
        self._stop_evt.clear()
        self._gen += 1
        st = plan.strategy
        name = mode_of(st)
        if name != "prov" and self.ctx.dataset.format != "lmdb":
            name = "index"  # no B+tree to walk: the same readers, located by the index
        mode = self._modes.get(name)
        if mode is None:
            mode = self._modes[name] = MODES[name](self)
        self._mode = mode
        rank = self.ctx.rank
        self.node = plan.world.node_of(rank)
        self.node_ranks = plan.world.ranks_of(self.node)
        self.aggregated = bool(st.aggregated) and self.world is not None
        readers = plan.readers_of(self.node) if st.aggregated else [rank]
        if st.aggregated and self.world is None:
            readers = [rank]  # one process: the node is this rank
        self.readers = readers
        self.is_reader = rank in readers
        self.j = readers.index(rank) if self.is_reader else -1
        self.plan = plan
        self.first = first_step
        self.max_len = int(plan.records.max_length)
        failure: BaseException | None = None
        try:  # a reader that cannot open its file still joins the collectives below
            if self.is_reader:
                mode.open(plan)
        except Exception as e:
            failure = e
        late = mode.setup(plan)  # every rank, even one whose open failed
        failure = failure or late
        self._alloc(mode.half_bytes())  # after setup: PROV sizes it by its windows
        mode.ready()
        if failure is not None:
            raise _typed(failure, self._path) from failure

    def _alloc(self, half: int) -> None:
        half = max(half, 1)
        self._window_bytes = 2 * half
        if self.aggregated:
            self._shm = self.world.node_array((2, half), np.uint8, owner=0)
            self._buf = self._shm.array
        else:
            self._buf = np.empty((2, half), dtype=np.uint8)

    # ------------------------------------------------------------ per step
    def get(self, step: int) -> RawBatch:
        assert self._mode is not None, "get() before start()"
        return self._mode.get(step)

    def _step_batch(
        self, step: int, read_part: Callable[[int, np.ndarray, np.ndarray], np.ndarray]
    ) -> RawBatch:
        """One step of every mode but PROV: the unit's records split among the readers,
        this reader's part read by *read_part* into the step's half, the node meeting,
        and this rank's sub-batch copied out."""
        plan = self.plan
        unit_ids = (
            plan.node_samples(self.node, step)
            if self.aggregated
            else plan.samples(self.ctx.rank, step)
        )
        k = len(self.readers)
        half = self._buf[step % 2]
        lengths = None
        failure = None
        if self.is_reader:
            lo, hi = even_split(len(unit_ids), k, self.j)
            dest = half[lo * self.max_len : hi * self.max_len]
            try:
                lengths = read_part(step, unit_ids[lo:hi], dest)
            except BaseException as e:
                if not self.aggregated:
                    raise
                failure = _Failed(e)
        if not self.aggregated:
            assert lengths is not None
            n = int(lengths.sum())
            return RawBatch(unit_ids, half[:n].copy(), lengths)
        got = self._meet(failure or lengths)
        parts = [g for g in got if g is not None]  # readers' lengths, in node-rank order
        # slot i of the node list: part p holds [lo_p, hi_p); records back to back there
        src = np.zeros(len(unit_ids), dtype=np.int64)
        size = np.zeros(len(unit_ids), dtype=np.int64)
        for p, ln in enumerate(parts):
            lo, hi = even_split(len(unit_ids), k, p)
            size[lo:hi] = ln
            if hi > lo:
                src[lo] = lo * self.max_len
                src[lo + 1 : hi] = lo * self.max_len + np.cumsum(ln[:-1])
        L = plan.step_len(step)  # the global step: sub-batch bounds are over all ranks
        P = plan.world.size
        a = int(even_start(L, P, self.ctx.rank) - even_start(L, P, self.node_ranks.start))
        b = int(even_start(L, P, self.ctx.rank + 1) - even_start(L, P, self.node_ranks.start))
        if a == b:
            return RawBatch.empty()
        data = gather(half, src[a:b], size[a:b])
        return RawBatch(unit_ids[a:b], data, size[a:b])

    def _meet(self, payload: Any) -> list[Any]:
        """The node meeting: every rank's *payload* (a reader's lengths or failure, or
        None) on every rank of the node, in node-rank order; a reader's failure is
        raised on all of them."""
        t0 = time.perf_counter()
        got = self.world.allgather(payload, comm=self.world.node_comm, stop=self._stop_evt)
        self._wait_add("sync_wait_s", t0)
        self._node_syncs += 1
        for g in got:
            if isinstance(g, _Failed):
                raise g.exc
        return got

    def _wait_add(self, key: str, t0: float) -> None:
        dt = time.perf_counter() - t0
        self.c[key] += dt
        self.c["skew_s"] += dt

    def request_stop(self) -> None:
        self._stop_evt.set()

    def _poll(self, req) -> None:
        if self.world is not None:
            self.world.wait(req, stop=self._stop_evt, what="the cursor hand-off")
            return
        pause = defaults.get("poll_sleep_us") * 1e-6
        while not mpi.done(req):
            time.sleep(pause)

    # ------------------------------------------------------------- lifecycle
    def stop(self) -> None:
        for mode in self._modes.values():
            mode.stop()  # DM: the prefetch in flight, the cursor sends
        self._token = None
        self._buf = None  # dropped before the next start allocates (else 2x the cap)
        if self._shm is not None:
            shm, self._shm = self._shm, None
            if not mpi.finalized():
                shm.free()  # collective over the node

    def memory_bytes(self, plan) -> int:
        rpn = max(1, self.ctx.ranks_per_node)
        sub = -(-plan.batch_size // plan.world.size)
        # two halves of the unit's records (per rank: the Loader multiplies by the node's ranks)
        unit = sub * (rpn if plan.strategy.aggregated else 1)
        per_unit = MODES[mode_of(plan.strategy)].memory(plan, unit)
        return per_unit // rpn if plan.strategy.aggregated else per_unit

    def stats(self) -> dict[str, Any]:
        """Per-rank counters (seconds, bytes, operations); see ``docs/lmdbio.md``."""
        c = dict(self.c)
        eng = self._engine.stats() if self._engine is not None else {}
        read_bytes = int(eng.get("storage_bytes", 0)) + c["read_bytes"]
        read_ops = int(eng.get("storage_ops", 0)) + c["read_ops"]
        for mode in self._modes.values():  # the mmap cursor's pages and faults
            touched, faults = mode.storage()
            read_bytes += touched
            read_ops += faults
        out = {
            "mode": self._mode.name if self._mode is not None else None,
            "reader": bool(getattr(self, "is_reader", False)),
            "storage_bytes": read_bytes + c["seek_bytes"],
            "storage_ops": read_ops + c["seek_ops"],
            "redundant_bytes": max(0, read_bytes + c["seek_bytes"] - c["payload_read_bytes"]),
            "buffer_bytes": self._window_bytes,
            "node_syncs": self._node_syncs,
            "stagger": self._stagger_n,
        }
        for mode in self._modes.values():
            out.update(mode.stats(c))  # DM: spec_extra_bytes
        c.update(out)
        return c

    def close(self) -> None:
        self.stop()
        for mode in self._modes.values():
            mode.close()
        if self._engine is not None:
            self._engine.close()
            self._engine = None


register_source(LmdbioSource, presets=PRESETS)


# ------------------------------------------------------------------ statistics

TABLE = (
    ("rank", "rank", "d"),
    ("reader", "reader", ""),
    ("seek s", "seek_s", ".3f"),
    ("I/O s", "io_s", ".3f"),
    ("skew s", "skew_s", ".3f"),
    ("storage MB", "storage_bytes", "MB"),
    ("ops", "storage_ops", "d"),
    ("redundant MB", "redundant_bytes", "MB"),
    ("ctx sw", "ctx_switches", "d"),
    ("peak RSS MiB", "peak_rss_bytes", "MiB"),
)


def gather_stats(loader) -> list[dict[str, Any]]:
    """Every rank's ``loader.stats()`` on every rank (collective under MPI), rank order.

    Adds ``ctx_switches`` (voluntary + involuntary, from getrusage).
    """
    mine = dict(loader.stats())
    mine["ctx_switches"] = int(mine.get("ctx_switches_voluntary", 0)) + int(
        mine.get("ctx_switches_involuntary", 0)
    )
    dist = getattr(loader.world, "dist", None)
    if dist is None or dist.size == 1:
        return [mine]
    return list(dist.allgather(mine))


def stats_table(rows: list[dict[str, Any]]) -> str:
    """The per-rank statistics as a Markdown table (seek/io/skew seconds, bytes, ops,
    redundant bytes, context switches, peak memory)."""
    head = "| " + " | ".join(t for t, _, _ in TABLE) + " |"
    lines = [head, "|" + "---|" * len(TABLE)]
    for r in rows:
        cells = []
        for _, key, fmt in TABLE:
            v = r.get(key)
            if v is None:
                cells.append("-")
            elif fmt == "MB":
                cells.append(f"{v / 1e6:.2f}")
            elif fmt == "MiB":
                cells.append(f"{v / 2**20:.0f}")
            elif fmt == "":
                cells.append("yes" if v else "no")
            else:
                cells.append(format(v, fmt))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
