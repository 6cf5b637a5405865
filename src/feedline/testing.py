# SPDX-License-Identifier: Apache-2.0
"""Conformance checks for Loader sources: run them against your own source.

A *source* (:mod:`feedline.sources.base`) brings one rank's raw records for each step
of a plan; the Loader does the rest. Every source feedline ships passes the checks of
this module (``tests/test_sources_conformance.py``), and a source you write should too::

    from feedline import open_dataset
    from feedline.testing import check_source, check_storage_error

    ds = open_dataset("/data/small-copy")  # small: every record is compared
    check_source(MySource, ds, batch_size=16)  # one process
    check_source(MySource, ds, batch_size=16, ranks=3)  # 3 ranks simulated in turn
    check_storage_error(MySource, open_dataset("/tmp/scratch"), batch_size=16)  # damages it!

:func:`check_source` runs the Loader on the source (``decode=False``, so it sees the
records' bytes) and asserts the contract:

- *exactly once*: every epoch (two by default, so a source that reads the next epoch
  ahead is checked too) delivers steps ``0 .. len(loader)-1`` on every rank, and every
  sample id exactly once across all ranks (S·B ids without repeats with ``drop_last``;
  every id, some twice, with ``circular``); a full step holds B samples and the
  sub-batches of a step differ by at most one sample, lower ranks taking the extra;
- *the plan's order*: each sub-batch holds the plan's ids for that rank and step
  (``Plan.samples(rank, step)``), in that order;
- *lengths and bytes*: each record's length and bytes equal the dataset's own
  (:meth:`feedline.Dataset.read`), ``Batch.nbytes`` is their sum;
- *resume*: ``state_dict()`` taken mid-epoch (in the last epoch) and loaded into a fresh
  Loader delivers exactly the remaining steps, with the same ids in the same order, even
  when that pass is dropped after one step (``break``) and ``iter()`` continues it; every
  rank holds the same state;
- *close*: ``close()`` of a Loader with a live pass, twice, then the source's own
  ``close()`` once more, raise nothing; ``iter()`` afterwards raises
  :class:`~feedline.ConfigError` ("closed") and ``next()`` on the old iterator raises
  ``StopIteration`` (docs/loader.md, "Concurrency").

:func:`check_storage_error` builds a Loader, then damages the dataset's files (truncates
each to half, or removes them, or calls your function) and asserts that iterating raises
a typed :class:`~feedline.FeedlineError` — :class:`~feedline.StorageError`,
:class:`~feedline.CorruptDataError` or :class:`~feedline.StaleDatasetError`, naming a
dataset file — within ``timeout_s`` (never a raw exception, a wrong epoch or a hang),
and that ``close()`` then returns within ``timeout_s`` as well. It destroys the files:
give it a copy.

Both raise ``AssertionError`` listing every violation found (they import no test
framework: call them from pytest, unittest or a script), ``ValueError`` for a
configuration the check cannot run (fewer than 2 steps per epoch), and let the Loader's
own errors through (a source that fails to read raises its error, not an assertion).

*Ranks.* ``ranks=P`` simulates P ranks in one process, one after another (the Loader's
world is ``LoaderWorld(rank, P)``; plans are pure, so each rank computes what it would
under MPI); that fits a source that reads on its own. A source that talks to other ranks
(``ctx.world``: node windows, the DeepIO store) runs under ``mpiexec -n P`` with
``ranks=1``: every rank calls the check with the same arguments, the Loader finds the
MPI world (or pass ``comm=``), and the ids are gathered over the Loader's communicator
so each rank asserts the whole job's contract (with a world that has no communicator,
a ``torch.distributed`` one, each rank checks its own part and the report's ``ids``
hold what it delivered, for the caller to gather). A violation found on any rank is
raised on every rank.

*Your source's name.* A source class that is not registered yet is registered for the
duration of the check (:func:`registered`), and unregistered after; a name registered
for another class is refused. A source runs the preset given, else the first preset
registered for it, else ``feedline``.

Writing a source
----------------
Subclass :class:`feedline.sources.base.Source`, give it a unique ``name`` and
implement ``start(plan, first_step)`` (prepare steps ``first_step, ...`` of the epoch's
plan for ``self.ctx.rank``; it is called again for every pass, possibly with another
plan or first step, after ``stop`` or ``finish``), ``get(step)`` (called in step
order: return a :class:`~feedline.sources.base.RawBatch` with the ids of
``plan.samples(self.ctx.rank, step)`` in that order, their stored bytes concatenated —
``self.ctx.dataset.index.extent(i)`` gives ``(file_id, offset, length)`` in
``self.ctx.dataset.files``, :meth:`~feedline.Dataset.read` the record — and their
lengths as int64) and ``stats()`` (a dict of counters); override ``stop`` (drop the
pass: cancel reads, join threads), ``request_stop`` (make a blocked ``get`` raise
:class:`~feedline.sources.base.SourceStopped` promptly, from any thread) and
``close`` (release everything; a second call does nothing) as soon as the source holds
threads, buffers or file descriptors, and ``memory_bytes(plan)`` if it buffers.
Storage failures must surface from ``get`` (or ``start``) as the typed errors above,
naming the file. Register it with ``register_source(MySource, presets=(...))`` (or
select it per Loader with ``Loader(..., source="my-source")`` once registered), then run
:func:`check_source` on a small dataset, at one and several ranks, and
:func:`check_storage_error` on a scratch copy.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .errors import ConfigError, CorruptDataError, FeedlineError, StaleDatasetError, StorageError
from .sources.base import PRESET_SOURCES, SOURCES, Source, _load, register_source

__all__ = [
    "STORAGE_ERRORS",
    "check_source",
    "check_storage_error",
    "default_preset",
    "registered",
    "source_class",
]

#: what a damaged dataset must raise (on at least one rank; the others may raise any
#: FeedlineError, e.g. ``PeerFailedError``)
STORAGE_ERRORS = (StorageError, CorruptDataError, StaleDatasetError)
_STORAGE_NAMES = ", ".join(e.__name__ for e in STORAGE_ERRORS)
_MAX_PROBLEMS = 20  # violations listed in one AssertionError (the rest are counted)
_REFUSED = ("decode", "transform", "source")


# ------------------------------------------------------------------ registration
def source_class(source: str | type[Source]) -> type[Source]:
    """The Source class for a registered name, or *source* itself when it is a class."""
    _load()
    if isinstance(source, str):
        if source not in SOURCES:
            raise ConfigError(f"unknown source {source!r}; known: {sorted(SOURCES)}")
        return SOURCES[source]
    if isinstance(source, type) and issubclass(source, Source):
        return source
    raise TypeError(f"a source name or a Source subclass, not {source!r}")


@contextlib.contextmanager
def registered(cls: type[Source], presets: tuple[str, ...] = ()) -> Iterator[type[Source]]:
    """Register *cls* (and *presets*) for the duration when it is not registered yet.

    Raises ``ValueError`` when ``cls.name`` is empty or names another registered class.
    """
    _load()
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} needs a name (the class attribute ``name``)")
    have = SOURCES.get(cls.name)
    if have is not None and have is not cls:
        raise ValueError(
            f"source name {cls.name!r} is taken by {have.__module__}.{have.__qualname__}: "
            "give your source another name"
        )
    if have is cls and not presets:
        yield cls
        return
    saved = dict(PRESET_SOURCES)
    register_source(cls, presets)
    try:
        yield cls
    finally:
        if have is None:
            SOURCES.pop(cls.name, None)
        PRESET_SOURCES.clear()
        PRESET_SOURCES.update(saved)


def default_preset(name: str) -> str:
    """The first preset registered for source *name*, else ``feedline``."""
    _load()
    return next((p for p, s in PRESET_SOURCES.items() if s == name), "feedline")


# ------------------------------------------------------------------ helpers
class _Problems:
    """Violations found on this rank (collected, not raised at once: under MPI every
    rank must go on with the same Loader calls, or its peers would wait for it)."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.count = 0

    def add(self, msg: str) -> None:
        self.count += 1
        if len(self.items) < _MAX_PROBLEMS:
            self.items.append(msg)

    def check(self, ok: bool, msg: str) -> bool:
        if not ok:
            self.add(msg)
        return bool(ok)


class _Records:
    """The dataset's own record of each id (read once, through ``Dataset.read``)."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset
        self.cache: dict[int, bytes] = {}

    def __call__(self, i: int) -> bytes:
        rec = self.cache.get(i)
        if rec is None:
            rec = self.cache[i] = bytes(self.dataset.read(i))
        return rec


def _open(dataset, comm):
    from .dataset import Dataset, open_dataset

    if isinstance(dataset, Dataset):
        return dataset
    if isinstance(dataset, str | os.PathLike):
        return open_dataset(dataset, comm=None if _is_loader_world(comm) else comm)
    raise TypeError(f"a Dataset or a path, not {type(dataset).__name__}")


def _is_loader_world(comm) -> bool:
    from .pipeline.world import LoaderWorld

    return isinstance(comm, LoaderWorld)


def _options(name: str, preset: str, seed: int, options: dict[str, Any]) -> dict[str, Any]:
    refused = sorted(k for k in options if k in _REFUSED)
    if refused:
        raise ValueError(
            f"{refused}: the check sets these itself (it runs the source given, on raw bytes)"
        )
    return dict(options, preset=preset, seed=seed, decode=False, source=name)


def _where(rank: int, epoch: int, step: int) -> str:
    return f"rank {rank} epoch {epoch} step {step}"


def _check_batch(b, expected: _Records, problems: _Problems, where: str) -> list[int]:
    """This batch's ids; its lengths and bytes against the dataset's records."""
    ids = np.asarray(b.ids)
    lengths = np.asarray(b.lengths)
    if not problems.check(
        ids.ndim == 1 and lengths.shape == ids.shape,
        f"{where}: ids {ids.shape} and lengths {lengths.shape} differ in shape",
    ):
        return [int(i) for i in ids.ravel()]
    ids = ids.astype(np.int64)
    lengths = lengths.astype(np.int64)
    data = np.asarray(b.data)
    total = int(lengths.sum())
    problems.check(int(b.nbytes) == total, f"{where}: nbytes {b.nbytes} != sum(lengths) {total}")
    if not problems.check(data.dtype == np.uint8, f"{where}: data is {data.dtype}, not uint8"):
        return ids.tolist()
    if data.ndim == 2:  # fixed-size records
        ok = data.shape[0] == len(ids) and bool(np.all(lengths == data.shape[1]))
        if not problems.check(ok, f"{where}: data {data.shape} vs lengths {lengths.tolist()}"):
            return ids.tolist()
        recs = [data[k] for k in range(len(ids))]
    else:
        if not problems.check(
            data.ndim == 1 and data.size == total,
            f"{where}: {data.size} bytes of data for lengths summing to {total}",
        ):
            return ids.tolist()
        ends = np.cumsum(lengths)
        recs = [data[e - n : e] for e, n in zip(ends.tolist(), lengths.tolist(), strict=True)]
    n = len(expected.dataset.index)
    for i, ln, rec in zip(ids.tolist(), lengths.tolist(), recs, strict=True):
        if not problems.check(0 <= i < n, f"{where}: id {i} outside [0, {n})"):
            continue
        want = expected(i)
        if problems.check(ln == len(want), f"{where}: id {i} has length {ln}, not {len(want)}"):
            problems.check(rec.tobytes() == want, f"{where}: id {i}: wrong bytes")
    return ids.tolist()


def _gather(comm, value):
    return comm.allgather(value) if comm is not None else [value]


def _barrier(comm) -> None:
    if comm is not None:
        comm.Barrier()


def _world_comm(loader) -> Any:
    """The Loader's MPI communicator when it spans several ranks, else None."""
    comm = getattr(loader.world, "comm", None)
    return comm if loader.world.size > 1 and hasattr(comm, "allgather") else None


def _raise(what: str, problems: list[str], count: int) -> None:
    if count:
        more = f"\n  ... and {count - len(problems)} more" if count > len(problems) else ""
        raise AssertionError(f"{what}:\n  - " + "\n  - ".join(problems) + more)


# ------------------------------------------------------------------ check_source
def check_source(
    source: str | type[Source],
    dataset,
    *,
    batch_size: int,
    preset: str | None = None,
    ranks: int = 1,
    seed: int = 0,
    epochs: int = 2,
    resume_step: int | None = None,
    **loader_options: Any,
) -> dict[str, Any]:
    """Run the Loader on *source* over *dataset* and assert the source contract.

    Parameters
    ----------
    source : str or Source subclass
        A registered source name, or a class (registered for the check if it is not).
    dataset : Dataset or path
        Small: every delivered record is compared with ``dataset.read(id)``.
    batch_size : int
        Global batch; the epoch needs at least 2 steps.
    preset : str, optional
        Default: the first preset registered for the source, else ``feedline``.
    ranks : int
        Ranks simulated in this process (1: this process's own world, MPI or not).
    seed : int
    epochs : int
        Epochs iterated by one Loader (each checked; default 2).
    resume_step : int, optional
        Step of the last epoch at which the state is taken (default: the middle).
    **loader_options
        Passed to every :class:`~feedline.Loader` (``comm``, ``memory_cap``, knobs ...);
        not ``decode``, ``transform`` or ``source``.

    Returns
    -------
    dict
        ``source``, ``preset``, ``ranks``, ``steps``, ``samples`` (per epoch, all
        ranks), ``epochs``, ``resume`` (``[epoch, step]``), ``stats`` (the Loader stats of
        this process's first rank), and ``ids`` (this process's ranks:
        ``{rank: [[ids of each step] for each epoch]}``).

    Raises
    ------
    AssertionError
        Every violation found (up to 20 listed), on every rank.
    """
    if not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"ranks must be an int >= 1, got {ranks!r}")
    if not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be an int >= 1, got {epochs!r}")
    cls = source_class(source)
    with registered(cls):
        name = cls.name
        preset = preset or default_preset(name)
        opts = _options(name, preset, seed, loader_options)
        if ranks > 1:
            if "comm" in opts:
                raise ValueError("ranks > 1 simulates the ranks: do not pass comm= as well")
            from .pipeline.world import LoaderWorld

            comms: list[Any] = [LoaderWorld(r, ranks) for r in range(ranks)]
        else:
            comms = [opts.pop("comm", None)]
        ds = _open(dataset, comms[0])
        expected = _Records(ds)
        runs = [
            _run_rank(cls, ds, batch_size, opts, comm, epochs, resume_step, expected)
            for comm in comms
        ]
        gathered = runs
        comm = runs[0].pop("comm")
        if comm is not None:  # a real multi-rank world: every rank sees every rank's run
            gathered = [r for part in _gather(comm, runs) for r in part]
        problems = _Problems()
        for r in gathered:
            for p in r["problems"]:
                problems.add(p)
            problems.count += r["count"] - len(r["problems"])
        size = runs[0]["size"]
        have_all = sorted(r["rank"] for r in gathered) == list(range(size))
        if have_all:
            _check_job(gathered, size, batch_size, epochs, problems)
        report = {
            "source": name,
            "preset": preset,
            "ranks": size,
            "steps": runs[0]["steps"],
            "epochs": epochs,
            "samples": [sum(len(i) for r in gathered for i in r["ids"][e]) for e in range(epochs)]
            if have_all
            else None,
            "resume": runs[0]["resume"],
            "stats": runs[0]["stats"],
            "ids": {r["rank"]: r["ids"] for r in runs},
        }
        _raise(
            f"source {name!r} (preset {preset!r}, {size} rank(s)) breaks the source contract",
            problems.items,
            problems.count,
        )
        return report


def _run_rank(cls, ds, B, opts, comm, epochs, resume_step, expected) -> dict[str, Any]:
    """One rank's part: the epochs, the close contract, the resume; problems collected."""
    from .loader import Loader

    problems = _Problems()
    name = cls.name
    ld = Loader(ds, B, comm=comm, **opts)
    rank = ld.world.rank
    run: dict[str, Any] = {"rank": rank, "size": ld.world.size, "comm": _world_comm(ld)}
    try:
        S = len(ld)
        if S < 2:
            raise ValueError(
                f"{S} step(s) per epoch: the check needs at least 2 (lower batch_size "
                f"below {len(ds)})"
            )
        k = S // 2 if resume_step is None else int(resume_step)
        if not 0 < k < S:
            raise ValueError(f"resume_step must be in [1, {S - 1}], got {resume_step}")
        problems.check(
            type(ld._source) is cls,
            f"rank {rank}: the Loader runs {type(ld._source).__name__}, not {cls.__name__}",
        )
        last = epochs - 1
        ids: list[list[list[int]]] = []
        state = None
        for e in range(epochs):
            ld.set_epoch(e)
            plan = ld._plan(e)
            steps: list[int] = []
            per_step: list[list[int]] = []
            for b in ld:
                where = _where(rank, e, b.step)
                problems.check(b.epoch == e, f"{where}: batch says epoch {b.epoch}")
                got = _check_batch(b, expected, problems, where)
                if 0 <= b.step < S:
                    want = plan.samples(rank, b.step).tolist()
                    problems.check(
                        got == want,
                        f"{where}: ids {got[:8]}... are not the plan's {want[:8]}... "
                        f"({len(got)} vs {len(want)} samples)",
                    )
                steps.append(int(b.step))
                per_step.append(got)
                if e == last and ld.step == k:
                    state = ld.state_dict()
            problems.check(
                steps == list(range(S)),
                f"rank {rank} epoch {e}: steps {steps[:12]} delivered, not 0..{S - 1}",
            )
            ids.append(per_step)
        run["stats"] = ld.stats()
        problems.check(
            run["stats"].get("source") == name,
            f"rank {rank}: stats()['source'] is {run['stats'].get('source')!r}, not {name!r}",
        )
        _check_close(ld, problems, rank)
    finally:
        ld.close()
    run["steps"] = S
    run["n"] = ld.n
    run["drop_last"] = ld.drop_last
    run["circular"] = bool(ld.strategy.circular)
    run["ids"] = ids
    run["resume"] = [last, k]
    run["state"] = state
    if problems.check(state is not None, f"rank {rank}: no state taken at step {k}"):
        rest = _resume(ds, B, opts, comm, state, expected, problems, rank)
        problems.check(
            [s for s, _ in rest] == list(range(k, S)),
            f"rank {rank}: resumed at step {k} of epoch {last}, delivered steps "
            f"{[s for s, _ in rest][:12]}, not {k}..{S - 1}",
        )
        for s, got in rest:
            if k <= s < S:
                problems.check(
                    got == ids[last][s],
                    f"rank {rank} epoch {last} step {s} after resume: ids {got[:8]}... differ "
                    f"from the uninterrupted epoch's {ids[last][s][:8]}...",
                )
    run["problems"] = problems.items
    run["count"] = problems.count
    return run


def _check_close(ld, problems: _Problems, rank: int) -> None:
    """close() with a live pass, twice, and the source's close() again; then use."""
    it = iter(ld)
    next(it, None)  # a pass with reads in flight
    ld.close()
    ld.close()
    try:
        ld._source.close()  # the source's own close, a second time
    except Exception as e:
        problems.add(f"rank {rank}: a second Source.close() raised {type(e).__name__}: {e}")
    try:
        next(it)
    except StopIteration:
        pass
    except Exception as e:
        problems.add(
            f"rank {rank}: next() on a closed Loader's iterator raised {type(e).__name__}: {e}, "
            "not StopIteration"
        )
    else:
        problems.add(f"rank {rank}: next() on a closed Loader's iterator delivered a batch")
    try:
        iter(ld)
    except ConfigError as e:
        problems.check("closed" in str(e), f"rank {rank}: iter() after close(): {e}")
    except Exception as e:
        problems.add(
            f"rank {rank}: iter() after close() raised {type(e).__name__}: {e}, not ConfigError"
        )
    else:
        problems.add(f"rank {rank}: iter() after close() did not raise")


def _resume(ds, B, opts, comm, state, expected, problems, rank) -> list[tuple[int, list[int]]]:
    """A fresh Loader from *state*: one step, a dropped pass, then iter() again."""
    from .loader import Loader

    rest: list[tuple[int, list[int]]] = []
    with Loader(ds, B, comm=comm, **opts) as ld:
        ld.load_state_dict(state)
        ld.set_epoch(state["epoch"])
        remaining = len(ld) - state["step"]
        for _ in range(2 if remaining >= 2 else 1):
            for b in ld:
                where = _where(rank, state["epoch"], b.step) + " (resumed)"
                rest.append((int(b.step), _check_batch(b, expected, problems, where)))
                if len(rest) == 1 and remaining >= 2:
                    break  # drop the pass (the source stops); iter() goes on after the step
    return rest


def _check_job(runs, P: int, B: int, epochs: int, problems: _Problems) -> None:
    """Exactly once across ranks, step sizes and balance, one state for every rank."""
    by_rank = {r["rank"]: r for r in runs}
    first = by_rank[0]
    S, n, drop_last, circular = first["steps"], first["n"], first["drop_last"], first["circular"]
    total = S * B if (drop_last or circular) else n
    states = {repr(r["state"]) for r in runs}
    problems.check(len(states) == 1, f"the ranks hold different states: {sorted(states)[:2]}")
    for e in range(epochs):
        counts: dict[int, int] = {}
        for s in range(S):
            sizes = []
            for r in range(P):
                steps = by_rank[r]["ids"][e]
                got = steps[s] if s < len(steps) else []
                sizes.append(len(got))
                for i in got:
                    counts[i] = counts.get(i, 0) + 1
            if P > 1:
                problems.check(
                    max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True),
                    f"epoch {e} step {s}: sub-batch sizes {sizes} are not even (lower ranks "
                    "take the extra)",
                )
            want = B if s < S - 1 else total - (S - 1) * B
            problems.check(
                sum(sizes) == want, f"epoch {e} step {s}: {sum(sizes)} samples, not {want}"
            )
        delivered = sum(counts.values())
        problems.check(delivered == total, f"epoch {e}: {delivered} samples delivered, not {total}")
        twice = sorted(i for i, c in counts.items() if c > (2 if circular else 1))
        problems.check(
            not twice, f"epoch {e}: {len(twice)} id(s) delivered more than once, e.g. {twice[:8]}"
        )
        if not drop_last:
            missing = sorted(set(range(n)) - set(counts))
            problems.check(
                not missing, f"epoch {e}: {len(missing)} id(s) never delivered, e.g. {missing[:8]}"
            )


# ------------------------------------------------------------------ check_storage_error
def check_storage_error(
    source: str | type[Source],
    dataset,
    *,
    batch_size: int,
    damage: str | Callable[[Any], None] = "truncate",
    preset: str | None = None,
    seed: int = 0,
    timeout_s: float = 60.0,
    **loader_options: Any,
) -> BaseException:
    """Damage *dataset*'s files after the Loader is built; assert a typed error, no hang.

    Parameters
    ----------
    source : str or Source subclass
    dataset : Dataset or path
        A scratch copy: its files are damaged.
    batch_size : int
    damage : ``"truncate"``, ``"remove"`` or callable
        Truncate every file to half its size, remove every file, or ``damage(dataset)``
        (called on rank 0 only, between barriers, under MPI).
    preset : str, optional
    seed : int
    timeout_s : float
        Bound on the error's arrival, and on ``close()`` after it.
    **loader_options
        Passed to the :class:`~feedline.Loader`.

    Returns
    -------
    BaseException
        The error this rank's iteration raised.

    Raises
    ------
    AssertionError
        No error, an untyped one, no storage error on any rank, an error that names no
        dataset file, or a hang (iteration or close); on every rank.
    """
    from .loader import Loader

    cls = source_class(source)
    with registered(cls):
        name = cls.name
        preset = preset or default_preset(name)
        opts = _options(name, preset, seed, loader_options)
        comm_opt = opts.pop("comm", None)
        ds = _open(dataset, comm_opt)
        problems = _Problems()
        ld = Loader(ds, batch_size, comm=comm_opt, **opts)
        rank = ld.world.rank
        comm = _world_comm(ld)
        files = [os.path.realpath(f) for f in ds.files]
        _barrier(comm)
        if rank == 0:
            _damage(ds, damage)
        _barrier(comm)
        box: dict[str, Any] = {}

        def consume() -> None:
            try:
                for _ in ld:
                    pass
                box["error"] = None
            except BaseException as e:  # judged below
                box["error"] = e

        hung = _bounded(consume, timeout_s, f"feedline-check-r{rank}")
        error = box.get("error")
        if hung:
            problems.add(f"rank {rank}: neither an error nor the epoch's end within {timeout_s} s")
        elif error is None:
            problems.add(f"rank {rank}: the epoch ended without an error on damaged storage")
        elif not isinstance(error, FeedlineError):
            problems.add(
                f"rank {rank}: untyped {type(error).__module__}.{type(error).__name__}: {error}"
            )
        elif isinstance(error, STORAGE_ERRORS):
            path = getattr(error, "path", None)
            problems.check(
                path is None or os.path.realpath(path) in files,
                f"rank {rank}: {type(error).__name__} names {path!r}, not a dataset file",
            )
        if not hung and _bounded(ld.close, timeout_s, f"feedline-check-close-r{rank}"):
            problems.add(f"rank {rank}: close() after the error did not return in {timeout_s} s")
        typed = isinstance(error, STORAGE_ERRORS)
        outcome = (rank, typed, problems.items, problems.count)
        everyone = _gather(comm, outcome) if not hung else [outcome]
        merged = _Problems()
        for _, _, items, count in everyone:
            for p in items:
                merged.add(p)
            merged.count += count - len(items)
        if not merged.count and not any(t for _, t, _, _ in everyone):
            merged.add(
                f"no rank raised a storage error ({_STORAGE_NAMES}); rank {rank} raised "
                f"{type(error).__name__}: {error}"
            )
        _raise(
            f"source {name!r} (preset {preset!r}) on damaged storage ({damage!r})",
            merged.items,
            merged.count,
        )
        assert error is not None
        return error


def _bounded(fn: Callable[[], Any], timeout_s: float, name: str) -> bool:
    """Run *fn* on a daemon thread; True when it is still running after *timeout_s*."""
    t = threading.Thread(target=fn, name=name, daemon=True)
    t.start()
    t.join(timeout_s)
    return t.is_alive()


def _damage(ds, damage) -> None:
    if callable(damage):
        damage(ds)
    elif damage == "truncate":
        for f in ds.files:
            os.truncate(f, os.path.getsize(f) // 2)
    elif damage == "remove":
        for f in ds.files:
            os.unlink(f)
    else:
        raise ValueError(f"damage must be 'truncate', 'remove' or a callable, not {damage!r}")
