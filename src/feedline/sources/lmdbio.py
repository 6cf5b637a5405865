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

All presets deliver the plan's samples, so presets with the same assignment deliver
identical bytes. The trade-off of running every preset synchronously (read, meet,
copy, step after step) is that nothing overlaps reading: this source measures the
papers' read paths, not feedline's best pipeline (that is the ``feedline`` preset).
Per-rank statistics: :meth:`LmdbioSource.stats`; all ranks: :func:`gather_stats`,
printed by :func:`stats_table`.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import numpy as np

from .. import defaults
from ..dist import ops as mpi
from ..errors import FeedlineError
from ..pipeline.reader import ExtentReader, ReadList, gather
from ..plan.layout import even_split, even_start
from .base import RawBatch, Source, SourceContext, register_source
from .lmdb_readers import (
    Locator,
    MmapCursor,
    PageCursor,
    Speculative,
    new_counters,
    open_cursor,
    read_extents,
)
from .lmdb_walk import MAX_DEPTH, WalkCursor

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
_TAG = 0x4C4D  # cursor hand-off messages (on this source's own communicator)
_MSG = 2 + 2 + 2 * MAX_DEPTH  # generation, step, then WalkCursor.pack()
_LOCATE_RECORDS = 8192  # lmm-dio locates the records of ceil(8192 / B) steps at a time


class _Failed:
    """A reader's failure carried to the other ranks of its node."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


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
    """``cursor`` (liblmdb/mmap), ``dm``, ``dio`` (one locator, pread) or ``prov``."""
    if strategy.locate == "speculative":
        return "dm"
    if strategy.locate == "seek":
        return "cursor" if strategy.read == "mmap" else "dio"
    return "prov"


class LmdbioSource(Source):
    """Readers per the LMDBIO/MPI-Caffe presets; see the module docstring."""

    name = "lmdbio"
    #: the Loader keeps the strategy's ``stagger`` knob for this source (token passing)
    staggers = True

    def __init__(self, ctx: SourceContext) -> None:
        super().__init__(ctx)
        self.world = ctx.world
        self.c = new_counters()
        self._engine: ExtentReader | None = None
        self._cursor: MmapCursor | PageCursor | None = None
        self._spec: Speculative | None = None
        self._locator: Locator | None = None
        self._shm: Any = None
        self._comm: Any = None
        self._sends: list[Any] = []
        self._gen = 0
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
        self.mode = mode_of(st)
        if self.mode != "prov" and self.ctx.dataset.format != "lmdb":
            self.mode = "index"  # no B+tree to walk: the same readers, located by the index
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
                method = "pread" if st.read == "mmap" else st.read
                if self.mode == "cursor" and self._cursor is None:
                    self._cursor = open_cursor(
                        self._path, self.c, lambda: self._engine_for("pread")
                    )
                elif self.mode == "dm" and self._spec is None:
                    self._spec = Speculative(self._path, self._engine_for("pread"), self.c)
                elif self.mode in ("dio", "prov"):
                    self._engine_for(method)
                elif self.mode == "index":
                    self._engine_for(st.read)
        except Exception as e:
            failure = e
        if self.mode == "dm":
            self._ring_setup(plan)
        if self.mode == "dio":
            try:
                self._locate_setup(plan)
            except Exception as e:
                failure = failure or e
        if self.mode == "prov":
            self._windows_setup(plan)
        else:
            unit = -(-plan.batch_size // plan.world.size) * (
                len(self.node_ranks) if self.aggregated else 1
            )
            self._alloc(unit * self.max_len)
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
        if self.mode == "prov":
            return self._get_window(step)
        plan = self.plan
        if self.mode == "dio":
            self._maybe_locate(step)
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
                lengths = self._read_part(step, unit_ids[lo:hi], dest)
            except BaseException as e:
                if not self.aggregated:
                    raise
                failure = _Failed(e)
        if not self.aggregated:
            assert lengths is not None
            n = int(lengths.sum())
            return RawBatch(unit_ids, half[:n].copy(), lengths)
        t0 = time.perf_counter()
        got = self.world.allgather(
            failure or lengths, comm=self.world.node_comm, stop=self._stop_evt
        )
        self._wait_add("sync_wait_s", t0)
        self._node_syncs += 1
        parts = [g for g in got if g is not None]  # readers' lengths, in node-rank order
        for g in parts:
            if isinstance(g, _Failed):
                raise g.exc
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

    def _wait_add(self, key: str, t0: float) -> None:
        dt = time.perf_counter() - t0
        self.c[key] += dt
        self.c["skew_s"] += dt

    def _read_part(self, step: int, ids: np.ndarray, dest: np.ndarray) -> np.ndarray:
        if self.mode == "cursor":
            assert self._cursor is not None
            return self._cursor.read(ids, dest)
        if self.mode == "dm":
            return self._dm_part(step, ids, dest)
        if self.mode == "index":
            fid, off, ln = self.plan.records.extents(ids)
            read_extents(self._engine_for(self.plan.strategy.read), off, ln, dest, self.c, fid)
            return ln
        # dio: extents from the locator's broadcast
        u, offs, lens = self._located
        i = np.searchsorted(u, ids)
        if len(ids) and (len(u) == 0 or not np.array_equal(u[np.minimum(i, len(u) - 1)], ids)):
            raise FeedlineError(f"step {step}: records missing from the located extents")
        read_extents(self._engine_for(self.plan.strategy.read), offs[i], lens[i], dest, self.c)
        return lens[i].copy()

    # ------------------------------------------------------------------- DM
    def _ring_setup(self, plan) -> None:
        if self._comm is None and self.world is not None and self.world.size > 1:
            self._comm = mpi.dup(self.world.comm)  # collective: every rank, once
        if not self.is_reader:
            return
        self.ring = plan.readers if self.aggregated else list(range(plan.world.size))
        if self.world is None:
            self.ring = [self.ctx.rank]
        self.g = self.ring.index(self.ctx.rank)
        self._held: WalkCursor | None = None

    def _dm_part(self, step: int, ids: np.ndarray, dest: np.ndarray) -> np.ndarray:
        spec = self._spec
        assert spec is not None
        R, g = len(self.ring), self.g
        if len(ids):
            spec.prefetch(int(ids[0]), int(ids[-1]) + 1)  # speculative, before the cursor
        cursor = self._held
        if R > 1 and not (step == self.first and g == 0):
            cursor = self._recv_cursor(step)
        found = None
        try:
            if len(ids):
                cursor, found = spec.seek(cursor, ids)
        except BaseException:
            self._send_cursor(step, None, failed=True)
            raise
        self._held = cursor
        self._send_cursor(step, cursor)  # the next reader seeks while this one copies
        return spec.copy(found, dest) if found is not None else np.zeros(0, dtype=np.int64)

    def _successor(self, step: int) -> int | None:
        R, g = len(self.ring), self.g
        if R == 1 or (g == R - 1 and step == self.plan.num_steps - 1):
            return None
        return self.ring[(g + 1) % R]

    def _send_cursor(self, step: int, cursor: WalkCursor | None, failed: bool = False) -> None:
        dest = self._successor(step)
        if dest is None:
            return
        nxt = step + 1 if self.g == len(self.ring) - 1 else step
        msg = np.full(_MSG, -1, dtype=np.int64)
        msg[0], msg[1] = self._gen, nxt
        if failed:
            msg[2] = -2  # poison: this reader failed; the next one must not wait forever
        elif cursor is not None:
            msg[2:] = cursor.pack()
        self._sends.append((mpi.isend(self._comm, msg, dest, _TAG), msg))
        self._sends = [(r, m) for r, m in self._sends if not mpi.done(r)]

    def _recv_cursor(self, step: int) -> WalkCursor | None:
        src = self.ring[(self.g - 1) % len(self.ring)]
        buf = np.empty(_MSG, dtype=np.int64)
        t0 = time.perf_counter()
        while True:
            self._poll(mpi.irecv(self._comm, buf, src, _TAG))
            if buf[0] == self._gen and buf[1] == step:
                break  # older generations are leftovers of an abandoned pass
        self._wait_add("handoff_wait_s", t0)
        if buf[2] == -2:
            raise FeedlineError(f"reader rank {src} failed before handing over the LMDB cursor")
        if buf[3] <= 0:
            return None
        return WalkCursor.unpack(buf[2:])

    def request_stop(self) -> None:
        self._stop_evt.set()

    def _poll(self, req) -> None:
        if self.world is not None:
            self.world.wait(req, stop=self._stop_evt, what="the cursor hand-off")
            return
        pause = defaults.get("poll_sleep_us") * 1e-6
        while not mpi.done(req):
            time.sleep(pause)

    # ------------------------------------------------------------------ DIO
    def _locate_setup(self, plan) -> None:
        if self.aggregated:
            self.locator_rank = plan.readers[0]
        else:  # rank 0 locates for everyone; without MPI to share it, every rank itself
            self.locator_rank = 0 if self.world is not None else self.ctx.rank
        self.w_locate = max(1, -(-_LOCATE_RECORDS // plan.batch_size))
        self._located = (np.zeros(0, np.int64),) * 3
        if self.ctx.rank == self.locator_rank and self._locator is None:
            self._locator = Locator(self._path, self.c)

    def _maybe_locate(self, step: int) -> None:
        if (step - self.first) % self.w_locate:
            return
        plan = self.plan
        last = min(step + self.w_locate, plan.num_steps)
        payload: Any = None
        if self._locator is not None:
            try:
                pos = np.arange(step * plan.batch_size, min(last * plan.batch_size, plan.total))
                payload = self._locator.locate(plan.ids_at(pos))
            except BaseException as e:
                payload = _Failed(e)
        if self.world is not None and self.world.size > 1:
            t0 = time.perf_counter()
            payload = self.world.bcast(payload, root=self.locator_rank, stop=self._stop_evt)
            if self.ctx.rank != self.locator_rank:
                self._wait_add("locate_wait_s", t0)
        if isinstance(payload, _Failed):
            raise payload.exc
        self._located = payload

    # ------------------------------------------------------- PROV / COAL / STAG
    def _windows_setup(self, plan) -> None:
        from ..plan.reads import unit_of, window_ops, windows

        st = plan.strategy
        asked = self.ctx.extra.get("knobs", {}).get("stagger")
        n = (
            int(asked)
            if asked is not None
            else (max(1, len(plan.readers) // 2) if st.stagger else 0)
        )
        if n:
            plan = dataclasses.replace(plan, strategy=st.replace(stagger=n))
            self.plan = plan
            self._stagger_n = n
        self._steps = windows(plan)
        unit, readers = (
            unit_of(plan, self.readers[0]) if self.aggregated else (self.ctx.rank, [self.ctx.rank])
        )
        self._ops = [window_ops(plan, unit, readers, r, s) for r, s in enumerate(self._steps)]
        self._alloc(max((sum(o.nbytes for o in ops) for ops in self._ops), default=0))
        self._win = -1
        if self.is_reader and self._stagger_n and self.world is not None and len(plan.readers) > 1:
            self._token = self.world.token(plan.stagger(self.ctx.rank))
            self._token.stop = self._stop_evt

    def _get_window(self, step: int) -> RawBatch:
        while self._win < 0 or step >= self._steps[self._win].stop:
            self._next_window(self._win + 1)
        cur = self._cur
        i = step - cur["steps"].start
        a, b = int(cur["bounds"][i]), int(cur["bounds"][i + 1])
        if a == b:
            return RawBatch.empty()
        half = self._buf[self._win % 2]
        return RawBatch(
            cur["ids"][a:b], gather(half, cur["src"][a:b], cur["size"][a:b]), cur["size"][a:b]
        )

    def _next_window(self, r: int) -> None:
        ops = self._ops[r]
        failure = None
        if self.is_reader:
            op = ops[self.j]
            base = sum(o.nbytes for o in ops[: self.j])
            dest = np.zeros(len(op.lengths), dtype=np.int64)
            if len(op.lengths) > 1:
                np.cumsum(op.lengths[:-1], out=dest[1:])
            view = self._buf[r % 2, base : base + op.nbytes]
            engine = self._engine_for(self.plan.strategy.read)
            try:
                if self._token is not None:
                    t0 = time.perf_counter()
                    self._token.acquire()
                    self._wait_add("token_wait_s", t0)
                try:
                    t0 = time.perf_counter()
                    engine.read(ReadList(op.file_ids, op.offsets, op.lengths, dest), view)
                    self.c["io_s"] += time.perf_counter() - t0
                    self.c["records_read"] += len(op.ids)
                    self.c["payload_read_bytes"] += op.payload
                finally:
                    if self._token is not None:
                        self._token.release()  # passed on even after a failed read
                if self._token is not None and r == len(self._ops) - 1:
                    t0 = time.perf_counter()
                    self._token.close()  # the ring's last token comes home
                    self._wait_add("token_wait_s", t0)
            except BaseException as e:
                if not self.aggregated:
                    raise
                failure = _Failed(e)
        if self.aggregated:
            t0 = time.perf_counter()
            got = self.world.allgather(failure, comm=self.world.node_comm, stop=self._stop_evt)
            self._wait_add("sync_wait_s", t0)
            self._node_syncs += 1
            for g in got:
                if isinstance(g, _Failed):
                    raise g.exc
        self._index_window(r)

    def _index_window(self, r: int) -> None:
        """This rank's samples in window r: (step, slot) order and byte positions."""
        from .node import window_layout

        first = self.node_ranks.start if self.aggregated else self.ctx.rank
        self._cur = window_layout(self.plan, self._ops[r], self._steps[r], self.ctx.rank, first)
        self._win = r

    # ------------------------------------------------------------- lifecycle
    def stop(self) -> None:
        if self._spec is not None:
            self._spec.wait()
        for req, _ in self._sends:
            self._poll(req)
        self._sends.clear()
        self._token = None
        self._buf = None  # dropped before the next start allocates (else 2x the cap)
        if self._shm is not None:
            shm, self._shm = self._shm, None
            if not mpi.finalized():
                shm.free()  # collective over the node

    def memory_bytes(self, plan) -> int:
        from ..plan.reads import window_steps

        rpn = max(1, self.ctx.ranks_per_node)
        sub = -(-plan.batch_size // plan.world.size)
        steps = window_steps(plan) if mode_of(plan.strategy) == "prov" else 1
        # two halves of the unit's records (per rank: the Loader multiplies by the node's ranks)
        unit = sub * (rpn if plan.strategy.aggregated else 1)
        per_unit = 2 * steps * unit * int(plan.records.max_length)
        if mode_of(plan.strategy) == "dm":  # a reader's prefetch: its part and the margins
            per_unit += 2 * unit * int(plan.records.max_length)
        return per_unit // rpn if plan.strategy.aggregated else per_unit

    def stats(self) -> dict[str, Any]:
        """Per-rank counters (seconds, bytes, operations); see ``docs/lmdbio.md``."""
        c = dict(self.c)
        eng = self._engine.stats() if self._engine is not None else {}
        read_bytes = int(eng.get("storage_bytes", 0)) + c["read_bytes"]
        read_ops = int(eng.get("storage_ops", 0)) + c["read_ops"]
        if self._cursor is not None:
            touched, faults = self._cursor.storage()
            read_bytes += touched
            read_ops += faults
        out = {
            "mode": getattr(self, "mode", None),
            "reader": bool(getattr(self, "is_reader", False)),
            "storage_bytes": read_bytes + c["seek_bytes"],
            "storage_ops": read_ops + c["seek_ops"],
            "redundant_bytes": max(0, read_bytes + c["seek_bytes"] - c["payload_read_bytes"]),
            "buffer_bytes": self._window_bytes,
            "node_syncs": self._node_syncs,
            "stagger": self._stagger_n,
        }
        if c["spec_prefetch_bytes"]:
            out["spec_extra_bytes"] = max(0, c["spec_prefetch_bytes"] - c["spec_used_bytes"])
        c.update(out)
        return c

    def close(self) -> None:
        self.stop()
        for name in ("_cursor", "_spec", "_locator", "_engine"):
            obj = getattr(self, name)
            if obj is not None:
                obj.close()
                setattr(self, name, None)
        if self._comm is not None:
            mpi.free(self._comm)
            self._comm = None


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
