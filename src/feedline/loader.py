# SPDX-License-Identifier: Apache-2.0
"""The Loader: a plan executed by a source, delivered as batches, with exact resume.

Each epoch the Loader makes the pure plan of the epoch (``feedline.plan.make_plan``)
for this world, starts the preset's *source* (which brings this rank's raw records) and
runs it ahead of the consumer on background threads (read-ahead depth 2 = double
buffering), decoding and transforming in worker threads. Because the plan is pure, the
position in the epoch is just a step count: ``state_dict`` is a few hundred bytes and
resuming — even at another world size — replays the plan from that step. The trade-off
is memory for overlap: each step of read-ahead holds one more sub-batch per rank, and
the cap is checked before anything is read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import numbers
import os
import resource
import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from . import _core, defaults
from .batch import Batch
from .errors import (
    ConcurrencyError,
    ConfigError,
    StateError,
    StateMismatchError,
    StorageTimeoutError,
)
from .pipeline import state as _state
from .pipeline.options import PipelineOptions, default_buffer, default_read, pipeline_options
from .pipeline.passes import _AGREEING, listener
from .pipeline.passes import Epoch as _Epoch
from .pipeline.runner import EpochRun, inline_run
from .pipeline.world import LoaderWorld, resolve_world
from .plan.cost import node_reader_options
from .plan.records import as_records, top_bytes
from .sources.base import SOURCES, RawBatch, Source, SourceContext, source_name_for
from .units import format_bytes

__all__ = ["Batch", "Loader"]

_LIVE: weakref.WeakSet[Loader] = weakref.WeakSet()


class Loader:
    """Feeds this rank its share of every global batch, epoch after epoch.

    Parameters
    ----------
    data : str, os.PathLike, list of paths, or Dataset
        A dataset path (LMDB directory, HDF5/TFRecord/npy file, directory or glob), a
        list of files, or a Dataset from :func:`feedline.open_dataset`. With a path, the
        options of ``open_dataset`` (``format``, ``sidecar``, ``on_stale``, and the
        format's own: ``dataset=``/``labels=`` for HDF5, ``record_bytes=`` ...) go to
        it.
    batch_size : int
        The *global* batch B, a positive int; each of the P ranks gets a sub-batch of
        B/P (sizes differ by at most one, lower ranks take the extra).
    preset : str
        A strategy preset (``feedline``, ``tf``, ``tf-pre``, ``async``, ``async-db``, and
        those added by other sources); see ``docs/loader.md``.
    seed : int
        Seed of the shuffle; the epoch order is a pure function of (dataset, preset,
        seed, epoch) and, for presets that depend on it, the world size.
    comm : MPI communicator (``MPI.Comm``), optional
        Defaults to ``MPI.COMM_WORLD`` when launched by ``mpiexec``/``srun``, else one
        process. (Internal: a :class:`~feedline.pipeline.world.LoaderWorld`.)
    drop_last : bool
        Drop the last partial global batch (ConfigError when that leaves no step).
    decode : bool or None
        Decode records with the format's decoder (True), deliver raw bytes (False), or
        the dataset's choice (None, default: ``open_dataset(decode=)``, else detected;
        an LMDB whose records are not Caffe ``Datum`` gives raw bytes).
    transform : callable, optional
        ``transform(batch) -> batch``, run in the loader's worker threads after decoding.
    memory_cap : int or str, optional
        Bytes per node for buffers, read-ahead and index: an int, or a size with a unit
        (``"64MB"``, ``"64MiB"``, ``"2G"``, ``"2.5e9"``); default ``FEEDLINE_MEMORY_CAP``
        (same units): min(2.5 GB, RAM/4), divided among emulated nodes.
    **options
        :class:`~feedline.pipeline.options.PipelineOptions` (``shuffle``,
        ``prefetch_depth``, ``workers``, ``io_threads``, ``sample_threads``, ``buffer``,
        ``nodes``, ``timeout_s``, ``epochs``: the epochs the job means to read, for the
        cost model), ``source`` (a registered source name) and strategy knobs
        (``chunk``, ``coalesce_bytes``, ... see :class:`feedline.plan.Strategy`).

    Raises
    ------
    ConfigError
        Unknown option or preset, a batch size that is not a positive int, or a
        configuration that cannot fit the memory cap.
    DatasetNotFoundError, UnsupportedFormatError
        A path that does not exist, or whose format cannot be told.
    """

    def __init__(
        self,
        data,
        batch_size: int,
        preset: str = "feedline",
        seed: int = 0,
        comm: Any = None,
        drop_last: bool = False,
        decode: bool | None = None,
        transform=None,
        memory_cap: int | str | None = None,
        **options: Any,
    ) -> None:
        from .dataset import as_dataset
        from .plan.strategy import Strategy, get_strategy

        batch_size = _positive_int(batch_size, "batch_size")
        if not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or int(seed) < 0:
            raise ConfigError(f"seed must be an int >= 0, got {seed!r}")
        if transform is not None and not callable(transform):
            raise ConfigError("transform must be callable: transform(batch) -> batch")
        if decode is not None and not isinstance(decode, bool):
            raise ConfigError(f"decode must be True, False or None, not {decode!r}")
        self.batch_size: int = batch_size
        self.preset: str = preset if isinstance(preset, str) else "custom"
        self.seed: int = int(seed)
        self.drop_last: bool = bool(drop_last)
        self.transform: Any = transform
        explicit_source = options.pop("source", None)
        profile = options.pop("profile", None)
        nodes = pipeline_options({"nodes": options["nodes"]} if "nodes" in options else {})[0]
        self.world: LoaderWorld = resolve_world(comm, nodes.nodes)
        # a path is opened here with the options that belong to open_dataset
        dataset = as_dataset(data, self.world.comm, options)
        opts, knobs = pipeline_options(options)
        self.options: PipelineOptions = opts
        self.dataset: Any = dataset
        self._pid: int = os.getpid()
        #: the job's failure channel (None on one rank): see feedline.dist.alarm
        self._alarm: Any = getattr(self.world.dist, "alarm", None)
        if self.world.dist is not None:
            self.world.dist.timeout_s = float(opts.timeout_s)
        # one consumer at a time (ConcurrencyError)
        self._next_lock: _core.Gate = _core.Gate()  # read by Epoch's C next()
        self._index: Any = dataset.index
        self._records: Any = as_records(self._index)  # what the planner sees of it
        self.n: int = len(self._index)
        self.decode: bool = dataset.decodes if decode is None else decode
        # made at the first batch: a Datum decoder reads record 0, which could fail untyped
        self._decoder: Any = None  # at construction, on one rank
        if self.drop_last and self.n and self.n < self.batch_size:
            raise ConfigError(
                f"drop_last=True with a global batch of {self.batch_size} and {self.n} "
                "samples leaves no step: lower batch_size or pass drop_last=False"
            )
        self._source_name: str = source_name_for(self.preset, explicit_source)
        if self._source_name == "node" and self.world.dist is None:
            raise ConfigError("source='node' needs an MPI world (launch with mpiexec)")
        self._knobs: dict[str, Any] = dict(knobs)
        self.strategy: Strategy = self._make_strategy(get_strategy(preset), knobs)
        if explicit_source is None and not self.strategy.auto:
            # the store knob picks the DeepIO store (or takes a deepio preset off it)
            if self.strategy.store in ("ordered", "opportunistic"):
                if self._source_name == "direct":
                    self._source_name = "store"
            elif self._source_name == "store":
                self._source_name = "direct"
        self.memory_cap: int = self._resolve_cap(memory_cap)
        #: the cost model's choice (``feedline`` preset), for stats() and explain()
        self.choice: Any = None
        self._state_strategy: tuple[int, Strategy] | None = None
        if self.strategy.auto:
            self._choose(profile, explicit_source)
        elif profile is not None:
            raise ConfigError("profile= is used by the feedline preset's cost model only")
        if self._source_name == "node":  # its readers read for the node's ranks: their threads
            k, prof = self.strategy.readers_per_node, getattr(self.choice, "profile", None)
            self.options = node_reader_options(self.options, self.world, k, prof)
        ctx = SourceContext(
            dataset=dataset,
            rank=self.world.rank,
            size=self.world.size,
            options=self.options,  # with the model's node reader threads
            world=self.world.dist,
            memory_cap=self.memory_cap,
            ranks_per_node=self.world.ranks_per_node,
            extra={"knobs": dict(knobs)},
        )
        self._source: Source = SOURCES[self._source_name](ctx)
        self._epoch: int = 0
        self._step: int = 0  # next step to deliver in this epoch
        self._chain: list[list[int]] = [[self.world.size, self.world.nodes, 0]]
        self._run: EpochRun | None = None
        self._pool: ThreadPoolExecutor | None = None  # decode/transform workers, all passes
        self._run_first: int = 0
        self._rl: dict[int, float] = {}
        self._resumed: bool = False
        self._fingerprint: str | None = None
        self._lock = threading.Lock()
        self._closed: bool = False
        self._broken: str | None = None  # why the Loader may not iterate again
        self._exposed_s: float = 0.0
        self._delivered: int = 0
        self._samples: int = 0
        self._payload: int = 0
        self._decode_s: float = 0.0
        self._ru0: Any = resource.getrusage(resource.RUSAGE_SELF)
        self._t0: float = time.perf_counter()
        self._check_memory()
        _LIVE.add(self)

    # ------------------------------------------------------------ configuration
    def _make_strategy(self, base, knobs: dict[str, Any]):
        changes = dict(knobs)
        opts = self.options
        if opts.prefetch_depth is not None:
            changes["prefetch_depth"] = opts.prefetch_depth
        elif base.prefetch_depth >= 2 and defaults.origin("prefetch_depth") != "default":
            changes["prefetch_depth"] = int(defaults.get("prefetch_depth"))
        if not opts.shuffle:
            changes["assignment"] = "strided"
        st = base.replace(**changes) if changes else base
        if st.assignment == "chunk" and "chunk" not in knobs:
            mean = float(self._index.lengths.mean()) if self.n else 1.0
            if opts.buffer is not None:
                st = st.replace(chunk=opts.buffer.in_samples(mean))
            elif st.chunk == 0 and st.chunk_layout == "rank":
                st = st.replace(chunk=default_buffer().in_samples(mean))
        if self.preset == "feedline" and "read" not in knobs and st.read == "odirect":
            st = st.replace(read=default_read(self.dataset.files, opts.epochs))
        if self._source_name == "direct" and st.aggregated:
            # node aggregation needs the node source (MPI windows); direct reads per rank
            st = st.replace(readers_per_node=0)
        if (
            self._source_name == "lmdbio"
            and st.aggregated
            and st.locate not in ("seek", "speculative")
            and self.world.dist is None
            and self.world.size > 1
        ):
            # PROV's node windows need MPI shared memory (not torch.distributed's): per rank
            st = st.replace(readers_per_node=0)
        if st.stagger and not getattr(SOURCES[self._source_name], "staggers", False):
            st = st.replace(stagger=0)  # token passing is the LMDBIO source's
        if self._source_name == "node" and not st.aggregated:
            st = st.replace(readers_per_node=None)  # LMDBIO's rule: 1 reader <= 16 ranks
        return st

    def _choose(self, profile, explicit_source: str | None) -> None:
        """Resolve the ``feedline`` preset with the cost model (plan/cost.py): who reads
        (every rank, or one reader per node into a shared window), tiles and windows, or
        the DeepIO store (``store="auto"``). Pure: every rank agrees."""
        from .plan.cost import DECODE_RECORD_S, choose, get_profile
        from .plan.world import WorldSpec
        from .sources.store_plan import checked_choice, store_unavailable

        files = list(getattr(self.dataset, "files", []) or [])
        prof = get_profile(profile, files[0] if files else None)
        if explicit_source in (None, "node") and self.world.dist is not None:
            units = ("node",) if explicit_source == "node" else None
            aggregate = True
        else:
            units, aggregate = ("rank",), False
        base = self.strategy  # source="store": the store it is; the model picks R
        if explicit_source == "store" and base.store in ("auto", "off"):
            base = base.replace(store="ordered")
        mine = {k: v for k, v in self._knobs.items() if k in CHOSEN_KNOBS}
        store = store_unavailable(self.world, explicit_source, mine) or True
        records, spec = self._records, WorldSpec(self.world.size, self.world.nodes)
        args = (records, spec, self.batch_size, self._read_cap(), prof)
        kw: dict[str, Any] = {"host": self.world.host}  # the cpu term: ranks vs cores
        kw["record_cpu_s"] = DECODE_RECORD_S if self.decode else 0.0
        kw |= {"base": base, "aggregate": aggregate, "units": units, "epochs": self.options.epochs}

        def pick(why: bool | str):
            return choose(*args, store=why, **kw)

        threads = self.options.io_threads  # the store's bounce buffers (store_overflow)
        self.choice = checked_choice(pick, store, self._index, args, self.seed, base.store, threads)
        self.strategy = self.choice.strategy
        if mine:  # knobs the user set win over the model's choice
            # one of a pair sizes the same thing in other units: the model's other goes
            for pair in (("chunk", "chunk_bytes"), ("window_steps", "window_bytes")):
                for a, b in (pair, pair[::-1]):
                    if a in mine and b not in mine:
                        mine[b] = 0
            self.strategy = self.strategy.replace(**mine)
        if explicit_source is None and self.strategy.store in ("ordered", "opportunistic"):
            self._source_name = "store"
        elif explicit_source is None:
            self._source_name = "node" if self.strategy.aggregated else "direct"
        if self._source_name == "store" and "read" not in self._knobs:
            files, epochs = self.dataset.files, self.options.epochs
            self.strategy = self.strategy.replace(read=default_read(files, epochs, store=True))

    def explain(self) -> str:
        """The cost model's estimate of this Loader's plan and the runners-up."""
        if self.choice is None:
            return f"preset {self.preset!r} is fixed; no cost model ran"
        return self.choice.explain()

    def _resolve_cap(self, memory_cap) -> int:
        from .units import parse_bytes

        if memory_cap is None:
            cap = int(defaults.get("memory_cap"))
            if self.world.emulated:
                cap //= max(1, self.world.nodes)
        else:
            cap = parse_bytes(memory_cap, "memory_cap")
        if cap < 1:
            raise ConfigError(f"memory_cap must be positive, got {memory_cap!r}")
        return cap

    def _plan(self, epoch: int, first_step: int = 0, chain: list[list[int]] | None = None):
        from .plan.plan import make_plan
        from .plan.world import WorldSpec

        chain = chain or [[self.world.size, self.world.nodes, 0]]
        p0, m0, _ = chain[0]
        strategy = self.strategy
        if self._state_strategy is not None and self._state_strategy[0] == epoch:
            strategy = self._state_strategy[1]
        plan = make_plan(
            self._records,
            WorldSpec(p0, m0),
            strategy,
            self.seed,
            epoch,
            self.batch_size,
            self.drop_last,
            memory_cap=self._read_cap(),
        )
        for p, m, s in chain[1:]:
            plan = plan.resume(s, WorldSpec(p, m))
        here = WorldSpec(self.world.size, self.world.nodes)
        if first_step or plan.world != here:
            plan = plan.resume(first_step, here)
        if plan.strategy != self.strategy:
            # the epoch began under another choice of the cost model (a checkpoint from
            # another world size or cap): its remaining order, read our way
            plan = plan.rebase(self.strategy)
        return plan

    def _fixed_memory(self) -> dict[str, int]:
        """Bytes per node outside the source: read-ahead batches and the index."""
        sub = -(-self.batch_size // self.world.size)
        batch = top_bytes(self._records, sub)  # a sub-batch of the longest records
        depth = int(self.strategy.prefetch_depth)
        if inline_run(SOURCES[self._source_name], depth):
            depth = 0
        decoded = 2 if self.decode else 1  # raw bytes and their decoded copy
        rpn = self.world.ranks_per_node
        # the read-ahead batches, the one the caller holds, and the one being assembled
        # (its parts and their concatenation): measured by tests/test_memory_sweep.py
        live = depth + 3
        return {"batches": rpn * live * batch * decoded, "index": 20 * self.n}

    def _read_cap(self) -> int:
        """What is left of the node's cap for read buffers (the planner sizes windows in it)."""
        return max(1, self.memory_cap - sum(self._fixed_memory().values()))

    def memory_estimate(self) -> dict[str, int]:
        """Bytes per node this configuration holds at most, by part."""
        plan = self._plan(self._epoch)
        parts = {"source": self.world.ranks_per_node * self._source.memory_bytes(plan)}
        parts.update(self._fixed_memory())
        parts["total"] = sum(parts.values())
        return parts

    def _check_memory(self) -> None:
        try:
            est = self.memory_estimate()
        except ConfigError as e:
            raise ConfigError(f"preset {self.preset!r}: {e}") from None
        if est["total"] > self.memory_cap:
            raise ConfigError(
                f"preset {self.preset!r} with global batch {self.batch_size} on "
                f"{self.world.size} rank(s) needs about {format_bytes(est['total'])} per node "
                f"(source buffers {format_bytes(est['source'])}, read-ahead batches "
                f"{format_bytes(est['batches'])}, index {format_bytes(est['index'])}), over the "
                f"memory cap of {format_bytes(self.memory_cap)}. Lower batch_size, "
                f"prefetch_depth or buffer=, or raise memory_cap= (FEEDLINE_MEMORY_CAP)."
                + (
                    " The in-memory store holds R of the dataset (2R when R < 1): lower "
                    "memory_fraction=."
                    if self._source_name == "store"
                    else ""
                )
            )

    # -------------------------------------------------------------- iteration
    def __len__(self) -> int:
        """Steps per epoch (every rank runs all of them)."""
        from .plan.layout import num_steps

        return num_steps(self.n, self.batch_size, self.drop_last)

    @property
    def epoch(self) -> int:
        """The current epoch."""
        return self._epoch

    @property
    def step(self) -> int:
        """Steps of the current epoch already delivered."""
        return self._step

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to iterate; a different epoch restarts at step 0.

        Setting the epoch a resumed state points at keeps the resume position, so
        ``load_state_dict(s)`` then ``set_epoch(s["epoch"])`` continues mid-epoch.
        """
        if int(epoch) < 0:
            raise ConfigError(f"epoch must be >= 0, got {epoch}")
        if int(epoch) == self._epoch:
            return
        self._stop_run()
        self._resumed = False
        self._epoch = int(epoch)
        self._step = 0
        self._chain = [[self.world.size, self.world.nodes, 0]]

    def _check_usable(self) -> None:
        if os.getpid() != self._pid:
            raise ConcurrencyError(
                "this Loader was created in another process (before a fork): its threads "
                "and MPI state do not exist here; create a new Loader in the child"
            )
        if self._closed:
            raise ConfigError("this Loader is closed")
        if self._broken is not None:
            raise StorageTimeoutError(
                self.dataset.files[0],
                -1,
                self.options.timeout_s,
                f"this Loader abandoned a stalled read ({self._broken}); its buffers may "
                "still be written by that read: create a new Loader",
            )

    def __iter__(self) -> _Epoch:
        self._check_usable()
        if not self._next_lock.acquire(blocking=False):
            raise ConcurrencyError(
                "iter() while another thread is inside next() of this Loader: a Loader has "
                "one consumer at a time (give each thread its own Loader)"
            )
        try:
            return self._iter_locked()
        except Exception as e:
            if self._alarm is not None and self._source_name not in _AGREEING:
                self._alarm.announce(e)  # peers may already wait for this rank
            raise
        finally:
            self._next_lock.release()

    def _iter_locked(self) -> _Epoch:
        self._stop_run()
        steps = len(self)
        if self._step >= steps and not self._resumed:
            # a finished epoch iterates again from its start (a state loaded at the end
            # of an epoch, though, means "nothing left": one empty pass first)
            self._step = 0
            self._chain = [[self.world.size, self.world.nodes, 0]]
        self._resumed = False
        plan = self._plan(self._epoch, self._step, self._chain)
        first = self._step
        self._source.start(plan, first)
        if self.options.epochs is None or self._epoch + 1 < self.options.epochs:
            self._source.anticipate(_following(self, self._epoch + 1))  # not past the last
        depth = int(self.strategy.prefetch_depth)
        light = not self.decode and self.transform is None and self._index.packed is None
        if self._pool is None and not light and not inline_run(self._source, depth):
            self._pool = ThreadPoolExecutor(
                max_workers=self.options.workers,
                thread_name_prefix=f"feedline-pool-r{self.world.rank}-work",
            )
        run = EpochRun(
            self._source,
            first,
            steps,
            self._assemble,
            depth=depth,
            pool=self._pool,
            workers=self.options.workers,
            light=light,
            timeout_s=self.options.timeout_s,
            name=f"feedline-r{self.world.rank}",
            listen=listener(self),
        )
        self._run = run
        self._run_first = first
        return _Epoch(self, run)

    def _on_batch(self, run: EpochRun, batch: Batch) -> None:
        if run is self._run:
            self._step = run.next_step
        self._delivered += 1
        ids = getattr(batch, "ids", None)  # a transform may return another type
        if ids is not None:
            self._samples += len(ids)
            nbytes = getattr(batch, "nbytes", None)  # counted in the worker
            if nbytes is None:
                nbytes = int(np.asarray(batch.lengths).sum())
            self._payload += nbytes

    def _assemble(self, raw: RawBatch, step: int) -> Batch:
        t0 = time.perf_counter()
        ids, lengths, records = raw.ids, raw.lengths, raw.data
        if self._index.packed is not None:  # compressed: unpack spans into records
            records, lengths = self.dataset.unpack(records, lengths, ids)
        if self.decode:
            if self._decoder is None:
                self._decoder = self.dataset.decoder_for(True)
            data, labels = self._decoder.decode(records, lengths, np.asarray(ids, np.int64))
        else:
            data = records
            fixed = self._index.fixed_length
            if fixed is not None:
                data = data.reshape(len(ids), fixed)
            labels = None if self._index.labels is None else np.asarray(self._index.labels[ids])
        batch = Batch(data, labels, ids, lengths, step, self._epoch, int(lengths.sum()))
        if self.transform is not None:
            out = self.transform(batch)
            batch = out if out is not None else batch
        self._decode_s += time.perf_counter() - t0
        return batch

    def _stop_run(self) -> None:
        run, self._run = self._run, None
        if run is not None:
            self._exposed_s += run.exposed_s
            run.close()
            if run.abandoned:  # a reader thread is stuck in a stalled read
                self._broken = self._broken or "a reader thread stalled past timeout_s"

    # ------------------------------------------------------------------ state
    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = self.dataset.fingerprint
        return self._fingerprint

    def state_dict(self) -> dict[str, Any]:
        """The loader's position: small (< 4 KB), JSON-able, identical on every rank.

        Counts the batches already handed to the consumer (not those read ahead).
        """
        return _state.seal(
            {
                "epoch": self._epoch,
                "step": self._step,
                "seed": self.seed,
                "preset": self.preset,
                "strategy": self.strategy.to_dict(),
                "batch_size": self.batch_size,
                "drop_last": self.drop_last,
                "world_size": self.world.size,
                "nodes": self.world.nodes,
                "chain": [list(c) for c in self._chain],
                "n": self.n,
                "dataset": self.fingerprint,
            }
        )

    def load_state_dict(self, state: dict[str, Any] | str, strict: bool = True) -> None:
        """Continue where *state* left off (any world size; see ``docs/loader.md``).

        Parameters
        ----------
        state : dict or str
            From :meth:`state_dict` (or its JSON).
        strict : bool
            Refuse a state taken with another dataset, seed or preset (default). With
            False such a state is accepted (its seed is adopted) as long as the epoch
            can be resumed: same sample count, batch size, drop_last and sample order.

        Raises
        ------
        StateMismatchError
            (strict) The state belongs to another dataset, seed or preset.
        StateError
            The state is damaged, or was taken with another batch size or sample order.
        """
        body = _state.open_state(state)
        if strict:
            theirs_what = [
                f"{k}={body[k]!r} (this loader: {mine!r})"
                for k, mine in (("seed", self.seed), ("preset", self.preset))
                if body[k] != mine
            ]
            if theirs_what:
                raise StateMismatchError(
                    "loader state was taken with " + ", ".join(theirs_what) + ": resuming "
                    "would give another sample order; build the Loader with the state's "
                    "settings, or pass strict=False to adopt them"
                )
        theirs = None
        if self.choice is not None and body.get("preset") == self.preset:
            # the feedline preset: the cost model may have chosen otherwise for the world
            # the state was taken in; that epoch's order continues under its strategy
            from .plan.strategy import Strategy

            try:
                theirs = Strategy.from_dict(body["strategy"])
            except (ConfigError, TypeError) as e:
                raise StateError(f"loader state has an invalid strategy: {e}") from None
        _state.check_compatible(
            body,
            fingerprint=self.fingerprint if strict else body["dataset"],
            n=self.n,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            strategy=(theirs or self.strategy).to_dict(),
        )
        steps = len(self)
        if body["step"] > steps:
            raise StateError(
                f"loader state step {body['step']} is beyond the epoch's {steps} steps"
            )
        chain = [list(c) for c in body["chain"]] or [[body["world_size"], body["nodes"], 0]]
        if chain[0][2] != 0 or any(b[2] < a[2] for a, b in itertools.pairwise(chain)):
            raise StateError("loader state has an inconsistent world chain")
        if chain[-1][0] != body["world_size"]:
            raise StateError("loader state's world chain does not end at its world size")
        here = [self.world.size, self.world.nodes]
        if chain[-1][:2] != here and body["step"] < steps:
            chain.append([*here, body["step"]])
        self._stop_run()
        self.seed = body["seed"]
        self._epoch = body["epoch"]
        self._step = body["step"]
        self._chain = chain
        self._state_strategy = (
            (body["epoch"], theirs) if theirs is not None and theirs != self.strategy else None
        )
        self._resumed = True

    # ------------------------------------------------------------------ stats
    def stats(self) -> dict[str, Any]:
        """Counters of this rank since the Loader was made.

        ``exposed_io_s`` (time the consumer waited for batches), ``steps``, ``samples``,
        ``payload_bytes``, the source's ``storage_bytes``/``storage_ops``/``io_s`` (busy
        I/O thread-seconds)/``buffer_bytes``, ``decode_s``, ``peak_rss_bytes``,
        ``ctx_switches_voluntary``/``ctx_switches_involuntary``, ``memory_estimate_bytes``.
        """
        run = self._run
        exposed = self._exposed_s + (run.exposed_s if run is not None else 0.0)
        ru = resource.getrusage(resource.RUSAGE_SELF)
        out: dict[str, Any] = {
            "preset": self.preset,
            "source": self._source_name,
            "rank": self.world.rank,
            "ranks": self.world.size,
            "nodes": self.world.nodes,
            "exposed_io_s": exposed,
            "steps": self._delivered,
            "samples": self._samples,
            "payload_bytes": self._payload,
            "decode_s": self._decode_s,
            "wall_s": time.perf_counter() - self._t0,
            "peak_rss_bytes": int(ru.ru_maxrss) * 1024,
            "ctx_switches_voluntary": int(ru.ru_nvcsw - self._ru0.ru_nvcsw),
            "ctx_switches_involuntary": int(ru.ru_nivcsw - self._ru0.ru_nivcsw),
            "memory_cap_bytes": self.memory_cap,
        }
        e = min(self._epoch, 1)  # DeepIO's RL of the orders (a progressive store's epoch 0 own)
        if e not in self._rl:
            try:
                from .plan.rl import randomization_level

                self._rl[e] = float(randomization_level(self._plan(self._epoch)))
            except (ImportError, ConfigError, ValueError):
                self._rl[e] = float("nan")
        out.update({"rl": self._rl[e]} if self._rl[e] == self._rl[e] else {})  # not NaN
        with contextlib.suppress(ConfigError):  # pragma: no cover - checked at construction
            out["memory_estimate_bytes"] = self.memory_estimate()["total"]
        for k, v in self._source.stats().items():
            out.setdefault(k, v)
        if self.choice is not None:
            best = self.choice.best  # the plan that ran; its estimate next to measured passes
            out["epoch_s"] = list(self.__dict__.get("_pass_times", []))  # pipeline/passes.py
            out["plan"] = best.label()
            if mine := sorted((k, v) for k, v in self._knobs.items() if k in CHOSEN_KNOBS):
                out["plan"] += ", then " + ", ".join(f"{k}={v}" for k, v in mine)  # not the model's
            out["plan_profile"] = self.choice.profile.name
            out["plan_estimate_s"] = best.cost
            out["plan_estimate_terms"] = dict(best.terms)
            out["plan_requests_per_epoch"] = best.requests
            out["plan_store"] = self.choice.store_verdict  # the DeepIO store: chosen or why not
            out["plan_figures"] = dict(best.figures)  # the store's first and later epochs
        return out

    # -------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Stop reading and release threads, buffers and files. Idempotent.

        In a forked child it only marks the Loader closed: the threads, files and MPI
        state belong to the parent."""
        if self._closed:
            return
        if os.getpid() != self._pid:
            self._closed = True
            return
        self._stop_run()
        self._closed = True
        if self._broken is not None:  # threads may still use the source: leave it as is
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
            return
        try:
            self._source.close()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None
            self.world.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def __repr__(self) -> str:
        return (
            f"<feedline.Loader preset={self.preset} source={self._source_name} B={self.batch_size} "
            f"rank={self.world.rank}/{self.world.size} epoch={self._epoch} step={self._step}/{len(self)}>"
        )

    @property
    def options_summary(self) -> dict[str, Any]:
        """Effective options and strategy knobs (for logs and the bench)."""
        return {"pipeline": dataclasses.asdict(self.options), "strategy": self.strategy.to_dict()}


def _positive_int(value: Any, what: str) -> int:
    """*value* as an int >= 1; ConfigError for 0, negatives, 1.5, "8", True."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
        raise ConfigError(f"{what} must be a positive int, got {value!r}")
    return int(value)


#: knobs the cost model sets for the feedline preset (a user's value wins)
CHOSEN_KNOBS = (
    "region",
    "readers_per_node",
    "chunk",
    "chunk_bytes",
    "window_bytes",
    "window_steps",
    "coalesce_bytes",
)


def _following(loader: Loader, epoch: int):
    """The plan of *epoch* from step 0 (what a training loop's ``set_epoch(e + 1)`` asks
    for next), made on demand by the source's I/O thread; holds no reference to the
    Loader."""
    ref = weakref.ref(loader)

    def make():
        lo = ref()
        if lo is None or lo._closed:
            raise ConfigError("the Loader is gone")
        return lo._plan(epoch)

    return make


def _close_all() -> None:  # at interpreter exit: never leave reader threads behind
    try:
        alarm_mod = sys.modules.get("feedline.dist.alarm")
        if alarm_mod is not None:  # before closing: a failed job must not wait in close()
            alarm_mod.exit_guard()
        for loader in list(_LIVE):
            with contextlib.suppress(Exception):
                loader.close()
    finally:  # a store that gave up (Ctrl-C) still owes its peers one collective
        store = sys.modules.get("feedline.sources.store")
        if store is not None:
            store.flush_orphans()


import atexit  # noqa: E402

atexit.register(_close_all)
