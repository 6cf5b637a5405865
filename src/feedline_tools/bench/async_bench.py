# SPDX-License-Identifier: Apache-2.0
"""``feedline bench async``: Tables II-V and Figs. 9-10 of the asynchronous-I/O paper.

For CosmoFlow- and Neuron-Inverter-shaped HDF5 data (generated, or ``--path``), the four
I/O strategies of the paper (``tf``, ``tf-pre``, ``async``, ``async-db`` Loader presets)
and PyTorch's ``DataLoader`` over a map-style h5py dataset (``num_workers`` 0 and 2, each
rank its DistributedSampler-like share of the same global shuffle as ``tf``) run side by
side through the harness: every rank, cold cache, emulated compute per step. Each row
splits the epoch into exposed I/O (time the training loop waited for data), compute and
the rest. Then ``async-db`` runs once per I/O buffer size B (Figs. 9-10: exposed I/O vs
buffer MiB).

Compute per step is ``--compute-ms``, or with ``--compute auto`` (default) 1.2x the
``async`` read time per step (its exposed I/O per step), measured first in the same job
configuration without compute: the paper's regime, in which a read of one group takes less time than the
compute of the steps it feeds, so double buffering can hide it and one buffer cannot.
The trade-off of emulating compute by sleeping: it frees the CPU the way a GPU step
does, which is what lets reads overlap it on a 2-core machine, but it does not compete
with the I/O thread for memory bandwidth as a real model would.

``--ranks`` defaults to 4 (1 with ``--quick``; the job's size under ``mpiexec``).
Artefacts in ``--out``: ``async.md`` (the tables), ``async.json`` (or ``--json``),
``async-breakdown.png``, ``async-buffer-sweep.png``, plus each harness job's own
``async-<dataset>*.md/json/png``.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from feedline.errors import ConfigError
from feedline.units import count_at_least as at_least
from feedline_tools.bench import report
from feedline_tools.bench.async_report import markdown, plot, summarize
from feedline_tools.bench.digest import DeliveryRecorder
from feedline_tools.bench.harness import RunSpec, add_common_arguments, is_root, run_scenario
from feedline_tools.bench.runners import (
    DatasetSpec,
    LoaderRunner,
    PerFileSamples,
    RunContext,
    RunOutcome,
    _PeerBase,
    register_runner,
    sample_loader,
)
from feedline_tools.bench.worker import under_mpiexec, world_comm

PRESETS = ("tf", "tf-pre", "async", "async-db")
#: the default beside the paper's four: what Loader(path) exposes under the same compute
DEFAULT_ROW = "feedline"
TORCH_WORKERS = (0, 2)
AUTO_FACTOR = 1.2  # compute = 1.2 x async read time per step (the brief's regime)


@dataclass(frozen=True)
class Shape:
    """A dataset configuration of the scenario (generator options and loading knobs).

    ``buffer`` is the async-I/O buffer B in samples; ``sweep`` the buffer sizes of
    Figs. 9-10 in samples (clipped to each rank's share).
    """

    generator: str
    samples: int
    options: dict[str, Any]
    batch_size: int
    buffer: int
    sweep: tuple[int, ...]


# Full sizes run in minutes on 2 cores with 4 ranks; ~400 MB each, so that every rank
# reads tens of groups per epoch (the first group of an epoch is always exposed, so the
# exposed fraction of async-db is bounded below by 1 / groups per rank).
FULL = {
    "cosmoflow": Shape(
        "cosmoflow", 4096, {"cube": 16, "channels": 12, "files": 8}, 16, 32, (4, 16, 32, 128, 512)
    ),
    "neuron-inverter": Shape(
        "neuron-inverter", 20480, {"files": 4}, 64, 128, (16, 64, 128, 512, 2048)
    ),
}
QUICK = {
    "cosmoflow": Shape("cosmoflow", 64, {"cube": 8, "channels": 4, "files": 2}, 8, 8, (2, 8)),
    "neuron-inverter": Shape("neuron-inverter", 512, {"length": 160, "files": 2}, 32, 32, (8, 64)),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("async")
    g.add_argument(
        "--datasets",
        default="cosmoflow,neuron-inverter",
        metavar="LIST",
        help="which datasets (default cosmoflow,neuron-inverter)",
    )
    g.add_argument(
        "--compute",
        default="auto",
        metavar="auto|ms|model",
        help="compute per step: 'auto' = 1.2x the async read time per step, measured "
        "first (default), milliseconds (same as --compute-ms), or 'model' = a training "
        "step of a small torch MLP on the delivered bytes",
    )
    g.add_argument(
        "--samples", type=at_least(1), default=None, metavar="N", help="samples per dataset"
    )
    g.add_argument("--batch-size", type=at_least(1), default=None, metavar="B", help="global batch")
    g.add_argument(
        "--buffer",
        type=at_least(1),
        default=None,
        metavar="SAMPLES",
        help="async buffer B in samples",
    )
    g.add_argument(
        "--sweep",
        default=None,
        metavar="LIST",
        help="buffer sizes in samples for the sweep (empty: no sweep)",
    )
    g.add_argument(
        "--torch-workers",
        default=",".join(map(str, TORCH_WORKERS)),
        metavar="LIST",
        help="PyTorch DataLoader num_workers rows (default 0,2; empty: none)",
    )
    g.add_argument(
        "--epochs",
        type=at_least(1),
        default=None,
        metavar="E",
        help="epochs per run, averaged as the paper does (default 3; 1 with --quick)",
    )
    g.add_argument(
        "--evict-ms",
        type=float,
        default=100.0,
        metavar="MS",
        help="with several epochs, empty the page cache every MS ms (0: never)",
    )
    g.add_argument("--keep-data", action="store_true", help="keep generated data in --path")
    add_common_arguments(parser)


# ----------------------------------------------------------------------- runners


class _Timing:
    """Where a rank's epochs went besides the waits: Loader/DataLoader start-up, each
    epoch's first wait (the cold start of epoch 1 no prefetching can hide; in later
    epochs, what anticipation across the epoch boundary did not hide) and the compute
    actually slept (emulated compute plus the scheduler's wake-up latency)."""

    def __init__(self, model: bool = False) -> None:
        self.startup_s = 0.0
        self.first_waits: list[float] = []
        self.compute_s = 0.0
        self.waits: list[float] = []
        self.epoch_waits: list[float] = []  # exposed I/O of each epoch
        self.epoch_walls: list[float] = []  # and its wall time (first next() to the end)
        self._epoch_t0: float | None = None
        self._new_epoch = True
        self.model = None
        if model:
            from feedline_tools.bench.models import StepModel

            self.model = StepModel()

    def epoch(self) -> None:
        """The next wait is the first of an epoch (which ends the one before)."""
        self.end()
        self._new_epoch = True

    def end(self) -> None:
        """The epoch in progress is over (its wall time ends here)."""
        if self._epoch_t0 is not None:
            self.epoch_walls.append(time.perf_counter() - self._epoch_t0)
            self._epoch_t0 = None

    def wait(self, seconds: float) -> None:
        if self._new_epoch:
            self.first_waits.append(seconds)
            self.epoch_waits.append(0.0)
            self._epoch_t0 = time.perf_counter() - seconds
            self._new_epoch = False
        self.waits.append(seconds)
        self.epoch_waits[-1] += seconds

    def compute(self, ctx: RunContext, raw: Any = None, lengths: Any = None) -> None:
        """The step's compute: a training step of the small model when asked for (on the
        delivered bytes), else the harness's emulated compute (a sleep)."""
        t0 = time.perf_counter()
        if self.model is not None and lengths is not None:
            self.model.step(raw, np.asarray(lengths))
        else:
            ctx.compute()
        self.compute_s += time.perf_counter() - t0

    def extra(self) -> dict[str, float | None]:
        # the median wait is what every step pays even when its data is ready (handing
        # the sub-batch over); waits beyond it are reads that compute did not hide
        med = float(np.median(self.waits)) if self.waits else 0.0
        fw = self.first_waits
        self.end()
        later = sum(self.epoch_walls[1:])
        return {
            # the epochs after the first: what a long training run sees at every epoch
            "later_exposed_pct": 100 * sum(self.epoch_waits[1:]) / later if later else None,
            "startup_s": self.startup_s,
            "first_wait_s": fw[0] if fw else 0.0,
            "later_first_wait_s": float(np.mean(fw[1:])) if len(fw) > 1 else 0.0,
            "compute_actual_s": self.compute_s,
            "median_wait_s": med,
            "stall_s": float(sum(max(0.0, w - med) for w in self.waits)),
        }


class _CacheDropper:
    """Evicts the dataset's files from the page cache every *period_s* while a run goes
    on (rank 0 only: one machine has one page cache), so that no epoch after the first
    reads from memory what the previous one read — the regime of the paper, whose
    datasets do not fit in the nodes' memory. Eviction only drops clean pages nobody
    has mapped; the reads themselves are untouched."""

    def __init__(self, files: list[str], period_s: float) -> None:
        import threading

        from feedline_tools.bench.limit import evict

        self._evict = evict
        self.files = list(files)
        self.period_s = period_s
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-evict", daemon=True)

    def __enter__(self) -> _CacheDropper:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self._evict(self.files)
            self.count += 1

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def _dropper(ctx: RunContext, files: list[str], epochs: int, period_ms: float):
    import contextlib

    if epochs > 1 and period_ms > 0 and ctx.rank == 0:
        return _CacheDropper(files, period_ms / 1e3)
    return contextlib.nullcontext()


@register_runner("loader-timed")
class TimedLoaderRunner(LoaderRunner):
    """``loader:<preset>`` over *epochs* epochs (``set_epoch(e)`` each, as a training
    loop does) that also reports start-up, first-wait and actual compute seconds (in
    ``stats.extra``). With several epochs the page cache is emptied every
    *evict_ms* ms on rank 0 (see :class:`_CacheDropper`)."""

    def __init__(
        self,
        arg: str | None = None,
        model: bool = False,
        epochs: int = 1,
        evict_ms: float = 100.0,
        **options: Any,
    ) -> None:
        super().__init__(arg, **options)
        self.model = bool(model)
        self.epochs = max(1, int(epochs))
        self.evict_ms = float(evict_ms)

    def run(self, ctx: RunContext, rec: DeliveryRecorder) -> RunOutcome:
        out, tm = RunOutcome(), _Timing(self.model)
        t0 = time.perf_counter()
        loader = self._open(ctx)
        steps = len(loader) if ctx.steps is None else min(ctx.steps, len(loader))
        loader.set_epoch(0)
        it = iter(loader)
        tm.startup_s = time.perf_counter() - t0
        with _dropper(ctx, self._ds.files, self.epochs, self.evict_ms):
            for epoch in range(self.epochs):
                if epoch:
                    loader.set_epoch(epoch)
                    it = iter(loader)
                tm.epoch()
                for step in range(steps):
                    t0 = time.perf_counter()
                    batch = next(it)
                    wait = time.perf_counter() - t0
                    out.exposed_io_s += wait
                    tm.wait(wait)
                    data = np.ascontiguousarray(batch.data)
                    rec.add(epoch * steps + step, batch.ids, batch.lengths, data)
                    tm.compute(ctx, data, batch.lengths)
                tm.end()
        self._report(loader, out)
        out.extra |= tm.extra() | {"epochs": self.epochs}
        return out


# ------------------------------------------------------------------ the h5py peer


class _H5Samples(PerFileSamples):
    """Sample i is row ``i - first[file]`` of the HDF5 dataset, read with h5py."""

    def __init__(self, files: list[str], file_ids: np.ndarray, name: str) -> None:
        super().__init__(files, file_ids)
        self.first = np.searchsorted(self.file_ids, np.arange(len(self.files)))
        self.name = name

    def _open(self, fid: int) -> Any:
        import h5py

        return h5py.File(self.files[fid], "r")[self.name]

    def _close(self, handle: Any) -> None:
        handle.file.close()

    def __getitem__(self, i: int) -> tuple[int, bytes]:
        fid = int(self.file_ids[i])
        return int(i), self.handle(fid)[int(i - self.first[fid])].tobytes()


@register_runner("torch-h5py")
class TorchH5Runner(_PeerBase):
    """PyTorch ``DataLoader`` over a map-style h5py dataset, fed the rank's steps as its
    batch sampler (``workers`` processes, ``prefetch`` batches each)."""

    def __init__(
        self,
        arg: str | None = None,
        workers: int = 0,
        prefetch: int = 2,
        model: bool = False,
        epochs: int = 1,
        evict_ms: float = 100.0,
    ) -> None:
        super().__init__(arg)
        self.workers, self.prefetch = int(workers), int(prefetch)
        self.model = bool(model)
        self.epochs = max(1, int(epochs))
        self.evict_ms = float(evict_ms)
        self._ds: _H5Samples | None = None

    def prepare(self, ctx: RunContext) -> None:
        super().prepare(ctx)
        # each epoch the order of the 'tf' preset for that epoch (a DistributedSampler
        # with set_epoch), computed untimed
        self._epoch_steps = [self._steps] + [ctx.my_steps(epoch=e) for e in range(1, self.epochs)]

    def run(self, ctx: RunContext, rec: DeliveryRecorder) -> RunOutcome:
        try:
            import torch.utils.data  # noqa: F401
        except ImportError as e:
            raise ConfigError("the 'torch-h5py' runner needs PyTorch") from e
        index = self._index
        name = (index.meta or {}).get("dataset")
        if not name:
            raise ConfigError("torch-h5py reads HDF5 datasets only")
        out, tm = RunOutcome(), _Timing(self.model)
        t0 = time.perf_counter()
        self._ds = _H5Samples(index.files, index.file_ids, name)
        tm.startup_s = time.perf_counter() - t0
        with _dropper(ctx, index.files, self.epochs, self.evict_ms):
            for epoch, steps in enumerate(self._epoch_steps):
                t0 = time.perf_counter()
                batches = [s.tolist() for s in steps]
                it = iter(sample_loader(self._ds, batches, self.workers, self.prefetch))
                if epoch == 0:
                    tm.startup_s += time.perf_counter() - t0
                tm.epoch()
                for step in range(len(batches)):
                    t0 = time.perf_counter()
                    ids, lens, raw = next(it)
                    wait = time.perf_counter() - t0
                    out.exposed_io_s += wait
                    tm.wait(wait)
                    out.storage_ops += len(ids)
                    out.storage_bytes += len(raw)
                    rec.add(epoch * len(batches) + step, ids, lens, raw)
                    tm.compute(ctx, raw, lens)
                tm.end()
                del it
        out.io_s = out.exposed_io_s if self.workers == 0 else float("nan")
        out.extra = tm.extra() | {"epochs": self.epochs}
        return out

    def close(self) -> None:
        if self._ds is not None:
            self._ds.close()
            self._ds = None
        super().close()


# ---------------------------------------------------------------------- scenario


def _shapes(args: argparse.Namespace) -> dict[str, Shape]:
    table = QUICK if args.quick else FULL
    out = {}
    for name in [d for d in args.datasets.split(",") if d]:
        if name not in table:
            raise ConfigError(f"--datasets: unknown {name!r}; known: {', '.join(table)}")
        s = table[name]
        sweep = s.sweep if args.sweep is None else tuple(int(x) for x in args.sweep.split(",") if x)
        out[name] = Shape(
            s.generator,
            args.samples or s.samples,
            s.options,
            args.batch_size or s.batch_size,
            args.buffer or s.buffer,
            sweep,
        )
    return out


def _dataset_fn(name: str, shape: Shape, args: argparse.Namespace, tmp: list[str]):
    def make() -> DatasetSpec:
        from feedline_tools.make import generate

        if args.path:
            path = os.path.join(args.path, name)
        else:
            if not tmp:
                tmp.append(tempfile.mkdtemp(prefix="feedline-async-"))
            path = os.path.join(tmp[0], name)
        if not os.path.exists(os.path.join(path, ".feedline-make.json")):
            generate(
                shape.generator,
                path,
                samples=shape.samples,
                seed=0,
                force=True,
                progress=False,
                **shape.options,
            )
        return DatasetSpec(path, "hdf5")

    return make


def _sub_args(args: argparse.Namespace, **changes: Any) -> argparse.Namespace:
    a = copy.copy(args)
    a.json = None
    a.baseline = None
    for k, v in changes.items():
        setattr(a, k, v)
    return a


def _steps(n: int, batch: int, steps: int | None) -> int:
    s = math.ceil(n / batch)
    return s if steps is None else min(steps, s)


def _per_rank_share(n: int, ranks: int) -> int:
    return max(1, n // max(1, ranks))


def _row(run: dict[str, Any], compute_s: float) -> dict[str, Any]:
    """One table row: the average epoch of the run (the paper averages 3 epochs).
    Exposed I/O, first waits, start-up and actual compute are those of the rank that
    waited longest (the harness reports the slowest rank's exposed I/O); ``other`` is
    the rest of the job time (scheduler delays, skew, teardown). Start-up (making the
    Loader or DataLoader) happens once and is spread over the epochs."""
    st = run["stats"]
    waits = [w if w is not None else -1.0 for w in st["exposed_io_s"]]
    k = int(np.argmax(waits)) if waits else 0
    ex = (st.get("extra") or [None] * (k + 1))[k] or {}
    epochs = max(1, int(ex.get("epochs") or 1))

    def per(x: Any) -> Any:
        return None if x is None else x / epochs

    total = per(run["time_s"])
    exposed = per(run["exposed_io_s"])
    startup = per(ex.get("startup_s"))
    med = ex.get("median_wait_s")
    actual = per(ex.get("compute_actual_s", compute_s * epochs))
    other = None
    if total is not None and exposed is not None:
        other = max(0.0, total - exposed - actual - (startup or 0.0))
    return {
        "name": run["name"],
        "epochs": epochs,
        "exposed_io_s": exposed,
        "first_wait_s": ex.get("first_wait_s"),
        "later_first_wait_s": ex.get("later_first_wait_s") if epochs > 1 else None,
        "median_wait_ms": None if med is None else 1e3 * med,
        "stall_s": per(ex.get("stall_s")),
        "compute_s": compute_s,
        "compute_actual_s": actual,
        "startup_s": startup,
        "other_s": other,
        "total_s": total,
        "exposed_pct": 100 * exposed / total if total and exposed is not None else None,
        "later_exposed_pct": _worst(st, "later_exposed_pct") if epochs > 1 else None,
        "storage_ops": round(sum(v or 0 for v in st["storage_ops"]) / epochs),
        "MBps": run["MBps"],
        "rl": run["rl"],
        "digest": run["digest"],
        "error": run.get("error"),
        "params": run["params"],
    }


def _worst(st: dict[str, Any], key: str) -> float | None:
    """The largest of the ranks' *key* in ``stats.extra`` (None when none has it)."""
    vals = [e[key] for e in st.get("extra") or [] if e and e.get(key) is not None]
    return max(vals) if vals else None


def run(args: argparse.Namespace) -> int:
    shapes = _shapes(args)
    if args.ranks is None and not under_mpiexec():
        args.ranks = 1 if args.quick else 4
    model = args.compute == "model"
    try:
        fixed_ms = None if args.compute == "auto" else (0.0 if model else float(args.compute))
    except ValueError:
        raise ConfigError(
            f"--compute: 'auto', 'model' or milliseconds, not {args.compute!r}"
        ) from None
    if args.compute_ms:
        fixed_ms = float(args.compute_ms)
    extra_opts: dict[str, Any] = {"model": True} if model else {}
    epochs = args.epochs if args.epochs is not None else (1 if args.quick else 3)
    if epochs < 1:
        raise ConfigError(f"--epochs must be >= 1, got {epochs}")
    extra_opts |= {"epochs": epochs, "evict_ms": args.evict_ms}
    tf_workers = [int(w) for w in args.torch_workers.split(",") if w != ""]
    tmp: list[str] = []
    result: dict[str, Any] = {"scenario": "async", "datasets": {}}
    failed = False
    try:
        for name, shape in shapes.items():
            ds_fn = _dataset_fn(name, shape, args, tmp)
            spec_holder: list[DatasetSpec] = []

            def dataset(ds_fn=ds_fn, spec_holder=spec_holder) -> DatasetSpec:
                if not spec_holder:
                    spec_holder.append(ds_fn())
                return spec_holder[0]

            comm = world_comm()
            ranks = args.ranks or (comm.Get_size() if comm is not None else 1)
            steps = _steps(shape.samples, shape.batch_size, args.steps)
            buf = {"buffer": shape.buffer}
            entry: dict[str, Any] = {"shape": shape.__dict__ | {"sweep": list(shape.sweep)}}
            # 1. compute per step: 1.2 x the async read time per step, i.e. the time the
            # training loop waits for data per step when there is nothing to overlap
            # (exposed I/O without compute; the epoch time would add Loader start-up)
            if fixed_ms is None:
                # the same epochs and page-cache eviction as the timed rows: a single
                # epoch without the evicting thread reads faster than any timed epoch
                cal = run_scenario(
                    f"async-{name}-calibrate",
                    [
                        RunSpec(
                            "async",
                            "loader-timed:async",
                            buf | {"epochs": epochs, "evict_ms": args.evict_ms},
                            {"buffer_samples": shape.buffer},
                        )
                    ],
                    dataset,
                    _sub_args(args, compute_ms=0.0, no_plots=True, no_limit=True, no_digest=True),
                    batch_size=shape.batch_size,
                    runner_modules=[__name__],
                )
                if cal is None:  # not the root rank of a job started under mpiexec
                    compute_ms = None
                else:
                    t, w = cal["runs"][0]["time_s"], cal["runs"][0]["exposed_io_s"]
                    if t is None or w is None:
                        raise ConfigError(f"calibration failed: {cal['runs'][0]['error']}")
                    w /= epochs  # the mean epoch, like the rows
                    t /= epochs
                    compute_ms = AUTO_FACTOR * 1e3 * w / steps
                    entry["calibration"] = {
                        "async_time_s": t,
                        "async_exposed_io_s": w,
                        "epochs": epochs,
                        "steps": steps,
                        "read_ms_per_step": 1e3 * w / steps,
                    }
                compute_ms = _bcast(compute_ms)
            else:
                compute_ms = fixed_ms
            entry["compute_ms"] = compute_ms
            entry["epochs"] = epochs
            entry["compute"] = "model" if model else "sleep"
            compute_s = steps * compute_ms / 1e3
            # 2. Tables II-V: the four presets and the DataLoader baselines
            runs = [
                RunSpec(
                    p,
                    f"loader-timed:{p}",
                    (dict(buf) if p.startswith("async") else {}) | extra_opts,
                    {"preset": p},
                )
                for p in PRESETS
            ]
            runs.append(
                RunSpec(
                    DEFAULT_ROW,
                    f"loader-timed:{DEFAULT_ROW}",
                    dict(extra_opts),
                    {"preset": DEFAULT_ROW},
                )
            )
            runs += [
                RunSpec(
                    f"torch-w{w}",
                    "torch-h5py",
                    {"workers": w} | extra_opts,
                    {"peer": "torch DataLoader + h5py", "num_workers": w},
                    assignment="tf",
                )
                for w in tf_workers
            ]
            doc = run_scenario(
                f"async-{name}",
                runs,
                dataset,
                _sub_args(args, compute_ms=compute_ms, baseline="tf"),
                batch_size=shape.batch_size,
                runner_modules=[__name__],
            )
            # 3. Figs. 9-10: async-db vs buffer size
            share = _per_rank_share(shape.samples, ranks)
            sizes = sorted({min(b, share) for b in shape.sweep})
            sweep = None
            if sizes:
                sweep = run_scenario(
                    f"async-{name}-sweep",
                    [
                        RunSpec(
                            f"async-db-B{b}",
                            "loader-timed:async-db",
                            {"buffer": b} | extra_opts,
                            {"buffer_samples": b},
                        )
                        for b in sizes
                    ],
                    dataset,
                    _sub_args(args, compute_ms=compute_ms, no_limit=True),
                    batch_size=shape.batch_size,
                    runner_modules=[__name__],
                )
            if doc is None:
                continue
            failed |= any(r.get("error") for r in doc["runs"])
            # payload of all epochs of the first run (every run delivers each sample once
            # per epoch)
            rec_bytes = doc["runs"][0]["payload_bytes"] / max(1, shape.samples * epochs)
            entry["ranks"] = doc["runs"][0]["ranks"]
            entry["steps"] = steps
            entry["record_bytes"] = rec_bytes
            entry["limit_MBps"] = doc["limit_MBps"]
            entry["rows"] = [_row(r, compute_s) for r in doc["runs"]]
            if sweep is not None:
                failed |= any(r.get("error") for r in sweep["runs"])
                entry["sweep"] = [
                    _row(r, compute_s)
                    | {
                        "buffer_samples": r["params"]["buffer_samples"],
                        "buffer_MiB": r["params"]["buffer_samples"] * rec_bytes / 2**20,
                    }
                    for r in sweep["runs"]
                ]
            entry["summary"] = summarize(entry["rows"])
            result["datasets"][name] = entry
    finally:
        if not args.keep_data:
            for d in tmp:
                shutil.rmtree(d, ignore_errors=True)
    if not is_root():
        return 0
    emit(result, args)
    return 1 if failed else 0


def _bcast(x: Any) -> Any:
    """The root's value on every rank when started under mpiexec (else *x*)."""
    from feedline_tools.bench.worker import world_comm

    comm = world_comm()
    return x if comm is None else comm.bcast(x, root=0)


def emit(result: dict[str, Any], args: argparse.Namespace) -> None:
    report.emit_scenario(result, args, "async", markdown(result), lambda: plot(result, args.out))


def load(path: str) -> dict[str, Any]:
    """Read a result document written by this scenario."""
    with open(path) as f:
        return json.load(f)
