# SPDX-License-Identifier: Apache-2.0
"""``feedline demo``: the Caffe/LMDB baseline and feedline's presets side by side.

The demo writes a small ``cifar10-large``-shaped LMDB (3 KB Caffe Datums) into a cache
directory, mounts the storage emulator over it with one view per emulated node (or, when
FUSE is not usable here, reads the local disk and says so), and runs the ``demo``
scenario of the bench harness under ``mpiexec`` (4 ranks on 2 emulated nodes by
default): the ``lmdb`` preset (every rank walks a cursor, the baseline), the LMDBIO
ladder (``lmm`` ... ``lmm-dio-prov-coal-stag``), the ``feedline`` preset — all through
:class:`feedline.Loader` — and a liblmdb cursor as an outside reference. It prints one
table (job time, bandwidth, fraction of the physical limit measured in the same job,
ratio to the baseline) and where the Markdown table, JSON and plots went. The emulator
is unmounted on exit, on Ctrl-C and on SIGTERM.

The trade-off is size for time: a few tens of MB in one repeat-median run keeps the demo
under two minutes on a 2-core machine, at the price of noisy figures (±30% between runs
on a shared machine) and a dataset far smaller than the papers' 50 M records. For figures
worth quoting use ``feedline bench lmdbio`` with larger ``--samples`` and more repeats.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from feedline.errors import ConfigError, FeedlineError
from feedline_tools.bench.report import CURSOR, ROWS, add_plot_arguments, shuffle_cell

#: the baseline every ratio refers to (Caffe/LMDB: every rank seeks with a cursor)
BASELINE = "lmdb"
#: LMDBIO journal §4.1-4.6, cumulative, in the paper's order
from feedline.sources.lmdbio import PRESETS as _LMDBIO_PRESETS  # noqa: E402

LADDER = tuple(p for p in _LMDBIO_PRESETS if p.startswith("lmm"))
#: feedline's own choice
FEEDLINE = "feedline"

DEFAULT_SAMPLES = 100_000
QUICK_SAMPLES = 2_000
#: the demo's storage: a parallel file system under load (1 ms per request, as LMDBIO's
#: GPFS and the async-I/O paper's Lustre show under many clients) read through a
#: client with the kernel's default 128 KiB read-ahead, so that mmap's page faults
#: (liblmdb) pay for their small requests as in the papers (docs/emulator.md)
DEMO_STORAGE = {"latency_us": 1000.0, "readahead_kib": 128}
DEFAULT_BATCH = 1024
QUICK_BATCH = 256


def cache_root() -> str:
    """Where the demo keeps its dataset: ``demo/`` in feedline's cache directory
    (``FEEDLINE_CACHE_DIR``, default ``~/.cache/feedline``)."""
    from feedline import defaults

    return os.path.join(defaults.get("cache_dir"), "demo")


def demo_presets(requested: Sequence[str] | None = None) -> list[str]:
    """The Loader presets the demo compares, baseline first.

    Parameters
    ----------
    requested : sequence of str, optional
        Presets to run instead of the default list (the baseline is always added first).

    Returns
    -------
    list of str
        ``lmdb``, the LMDBIO ladder presets this feedline has, ``feedline`` (by default).

    Raises
    ------
    ConfigError
        A requested preset does not exist.
    """
    from feedline.plan.strategy import PRESETS

    if requested:
        unknown = [p for p in requested if p not in PRESETS]
        if unknown:
            raise ConfigError(f"unknown preset(s) {unknown}; known: {', '.join(PRESETS)}")
        names = [BASELINE, *(p for p in requested if p != BASELINE)]
    else:
        names = [BASELINE, *(p for p in LADDER if p in PRESETS), FEEDLINE]
    if BASELINE not in PRESETS:
        raise ConfigError(f"this feedline has no {BASELINE!r} preset to compare against")
    return list(dict.fromkeys(names))


def ensure_dataset(
    root: str, samples: int, seed: int = 0, *, fresh: bool = False, echo: Callable = print
) -> str:
    """The demo's LMDB under *root*, generated once per (samples, seed) and reused.

    Generation goes to a private temporary directory that is renamed into place, so an
    interrupted or concurrent demo never leaves (or reads) a half-written dataset.
    """
    from feedline_tools.make import generate

    path = os.path.join(root, f"demo-cifar10-large-n{samples}-s{seed}")
    if fresh and os.path.isdir(path):
        shutil.rmtree(path)
    if os.path.isfile(os.path.join(path, "data.mdb")):
        echo(f"dataset: {path} (cached; --fresh regenerates)")
        return _indexed(path)
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".demo-gen-", dir=root)
    try:
        t0 = time.perf_counter()
        generate(
            "cifar10-large", os.path.join(tmp, "db"), samples=samples, seed=seed, progress=False
        )
        try:
            os.rename(os.path.join(tmp, "db"), path)
        except OSError:
            if not os.path.isfile(os.path.join(path, "data.mdb")):
                raise  # not a concurrent demo that got there first
        echo(
            f"dataset: {path} ({samples:,} CIFAR10-Large-shaped records, "
            f"written in {time.perf_counter() - t0:.1f} s)"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _indexed(path)


def _indexed(path: str) -> str:
    """Write the index sidecar beside the data before any emulator mounts it: the views
    are read-only and show it, so no rank writes one per mount into the cache directory."""
    from feedline.dataset import open_dataset

    with open_dataset(path, format="lmdb") as ds:
        _ = ds.index
    return path


@dataclass
class Storage:
    """Where the runs read: a path template and what it is."""

    path: str
    emulated: bool
    description: str
    emulator: Any = None


@contextlib.contextmanager
def storage(
    src: str, nodes: int, *, use_emulator: bool, echo: Callable = print, **params: Any
) -> Iterator[Storage]:
    """Mount the storage emulator over *src* (one view per node) for the duration, or
    fall back to the local path when it cannot run; always unmounts on the way out."""
    if not use_emulator:
        yield Storage(
            src,
            False,
            "local disk (--no-emulator): all emulated nodes share "
            "one page cache and no request pays network latency",
        )
        return
    from feedline_tools.emulate import Emulator, EmulatorUnavailable

    mnt = tempfile.mkdtemp(prefix="feedline-demo-mnt-")
    emu = None
    try:
        try:
            emu = Emulator(src, mnt, nodes=nodes, **{**DEMO_STORAGE, **params}).start()
        except (EmulatorUnavailable, FeedlineError) as e:
            # the first command a user runs: say plainly why, and still show something
            echo(f"storage emulator unavailable: {str(e).splitlines()[0]}")
            yield Storage(
                src,
                False,
                "local disk (the storage emulator could not start): "
                "all emulated nodes share one page cache and no request pays "
                "network latency, so LMDB's pathologies barely show",
            )
            return
        p = emu.params
        echo(f"storage emulator mounted at {mnt} ({nodes} node views)")
        yield Storage(
            emu.node_template,
            True,
            f"storage emulator, {nodes} nodes: {p.latency_us:g} µs per request (a "
            f"parallel file system under load), {p.readahead_kib} KiB client read-ahead "
            f"(the kernel's default), {p.node_mbps:g} MB/s per node, "
            f"{p.aggregate_mbps:g} MB/s aggregate, {p.servers} servers (docs/emulator.md)",
            emu,
        )
    finally:
        if emu is not None:
            emu.stop()
            echo(f"storage emulator unmounted from {mnt}")
        with contextlib.suppress(OSError):
            os.rmdir(mnt)


def build_runs(presets: Sequence[str], *, cursor: bool = True) -> list[Any]:
    """One bench run per Loader preset, plus the liblmdb cursor reference (which
    delivers the baseline's order, so its digest must equal the baseline's)."""
    from feedline_tools.bench.harness import RunSpec

    runs = [RunSpec(p, f"loader:{p}", params={"preset": p}) for p in presets]
    if cursor:
        runs.append(RunSpec(CURSOR, "lmdb", params={"peer": "liblmdb"}, assignment=BASELINE))
    return runs


def _source_of(run: dict[str, Any]) -> str:
    """Which executor delivered a run: the Loader's source (``direct``, ``node`` ...)."""
    extra = (run.get("stats") or {}).get("extra") or []
    names = sorted({str(e["source"]) for e in extra if isinstance(e, dict) and e.get("source")})
    if names:
        return "/".join(names)
    return "liblmdb" if run.get("runner") == "lmdb" else "-"


def _num(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def summary_table(doc: dict[str, Any]) -> str:
    """The demo's one table: time, bandwidth, fraction of the limit, ratio to the
    baseline, which executor ran it, and whether it delivered the baseline's stream."""
    base = next((r for r in doc["runs"] if r["name"] == doc["baseline"]), None)
    base_digest = base["digest"] if base else None
    head = [
        "run",
        "what it is",
        "reads via",
        "time s",
        "MB/s",
        "of limit",
        f"vs {doc['baseline']}",
        "shuffles?",
        "delivery",
    ]
    rows = []
    for r in doc["runs"]:
        if r.get("error"):
            rows.append(
                [
                    r["name"],
                    ROWS.get(r["name"], ""),
                    _source_of(r),
                    "failed",
                    r["error"][:60],
                    "",
                    "",
                    "",
                    "",
                ]
            )
            continue
        if base_digest is None or r["digest"] is None:
            same = "-"
        elif r["name"] == doc["baseline"]:
            same = "reference"
        else:
            same = "same as baseline" if r["digest"] == base_digest else "own order"
        frac = r["fraction_of_limit"]
        rows.append(
            [
                r["name"],
                ROWS.get(r["name"], ""),
                _source_of(r),
                _num(r["time_s"], ".2f"),
                _num(r["MBps"], ".0f"),
                "-" if frac is None else f"{100 * frac:.0f}%",
                "-" if r["ratio_to_baseline"] is None else f"{r['ratio_to_baseline']:.2f}x",
                shuffle_cell(r),
                same,
            ]
        )
    width = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    right = {3, 4, 5, 6}

    def line(cells: list[Any]) -> str:
        return "  ".join(
            str(c).rjust(w) if i in right else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(cells, width, strict=True))
        ).rstrip()

    out = [line(head), line(["-" * w for w in width])]
    out += [line(r) for r in rows]
    return "\n".join(out)


def _limit_line(doc: dict[str, Any]) -> str:
    lim = doc.get("limit") or {}
    if doc.get("limit_MBps") is None:
        why = lim.get("error") or "not measured"
        return f"physical limit: unknown ({why})"
    block = lim.get("block_bytes") or 8 << 20
    return (
        f"physical limit: {doc['limit_MBps']:.0f} MB/s = every rank reading its share "
        f"of the files with sequential {block >> 20} MiB {lim.get('method') or 'odirect'} "
        "reads through the same path (what IOR/fio report)"
        + (f"\nnote: {lim['note']}" if lim.get("note") else "")
    )


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM/SIGHUP raise KeyboardInterrupt, so the emulator is unmounted and the
    temporary files removed exactly as on Ctrl-C."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    old = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError):  # not the main thread
            old[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def run(args: argparse.Namespace) -> int:
    """Run the demo described by parsed *args*; 0 when every run succeeded."""
    from feedline_tools.bench.harness import is_root, run_scenario
    from feedline_tools.bench.runners import DatasetSpec
    from feedline_tools.bench.worker import under_mpiexec

    in_job = under_mpiexec()
    if in_job and not args.path:
        raise ConfigError(
            "run 'feedline demo' without mpiexec: it launches its own job (--ranks, "
            "--nodes); under mpiexec or srun give --path (a dataset every rank can read)"
        )
    echo = _echo if is_root() else _silent
    t_start = time.perf_counter()
    samples = args.samples or (QUICK_SAMPLES if args.quick else DEFAULT_SAMPLES)
    batch = args.batch_size or (QUICK_BATCH if args.quick else DEFAULT_BATCH)
    if samples < 1 or batch < 1:
        raise ConfigError("--samples and --batch-size must be >= 1")
    # in a job started by mpiexec/srun the job's size is the world: --ranks is ignored
    ranks = None if in_job else args.ranks
    if args.nodes < 1 or (ranks is not None and not args.nodes <= ranks):
        raise ConfigError(f"need 1 <= --nodes ({args.nodes}) <= --ranks ({args.ranks})")
    presets = demo_presets([p for p in (args.presets or "").split(",") if p])
    if is_root():  # find out now, not after a minute of measuring, that --out is unusable
        try:
            os.makedirs(args.out, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot write results to --out {args.out}: {e}") from None
        if not os.access(args.out, os.W_OK):
            raise ConfigError(f"cannot write results to --out {args.out}: not writable")
    runs = build_runs(presets, cursor=not args.no_cursor)
    # the harness's own options, with the demo's choices
    bench_args = argparse.Namespace(
        json=args.json,
        ranks=ranks,
        nodes=args.nodes,
        path=None,
        quick=args.quick,
        repeats=args.repeats if args.repeats is not None else (1 if args.quick else 3),
        out=args.out,
        baseline=BASELINE,
        compute_ms=0.0,
        steps=None,
        limit_block=8 << 20,
        no_limit=False,
        no_digest=False,
        no_plots=args.no_plots,
        no_warmup=False,
    )
    tmp_cache = None
    with _terminate_as_interrupt(), contextlib.ExitStack() as stack:
        if args.path:
            src = args.path
            echo(f"dataset: {src} (--path)")
            store = Storage(src, False, f"{src} as given (--path)")
        else:
            root = args.cache
            if args.no_cache:
                root = tmp_cache = tempfile.mkdtemp(prefix="feedline-demo-data-")
                stack.callback(shutil.rmtree, tmp_cache, ignore_errors=True)
            src = ensure_dataset(
                root or cache_root(),
                samples,
                args.seed,
                fresh=args.fresh,
                echo=echo,
            )
            store = stack.enter_context(
                storage(src, args.nodes, use_emulator=not args.no_emulator, echo=echo)
            )
        echo(f"storage: {store.description}")
        echo(
            f"running {len(runs)} configurations x {bench_args.repeats} repeat(s) on "
            f"{_job_size(ranks)} ranks / {args.nodes} nodes, global batch {batch}, "
            "each from cold cache ..."
        )
        # the harness prints its full Markdown table; the demo shows its own summary
        # and points at the full one, so keep the harness's copy out of the terminal
        quiet = io.StringIO()
        with contextlib.redirect_stdout(quiet):
            doc = run_scenario(
                "demo",
                runs,
                DatasetSpec(store.path, "lmdb"),
                bench_args,
                batch_size=batch,
                assignment=BASELINE,
                seed=args.seed,
            )
        if doc is None:  # a non-root rank when started under mpiexec
            return 0
        echo("")
        echo(summary_table(doc))
        echo("")
        echo(_limit_line(doc))
        out = os.path.abspath(args.out)
        json_path = os.path.abspath(args.json) if args.json else os.path.join(out, "demo.json")
        echo(f"full table: {os.path.join(out, 'demo.md')}")
        echo(f"JSON:       {json_path}")
        if not args.no_plots:
            echo(f"plots:      {os.path.join(out, 'demo-*.png')}")
        if not store.emulated and not args.path:
            echo(
                "note: read from local disk, not the emulator; figures say little about "
                "a parallel file system"
            )
        if any(r.get("error") for r in doc["runs"]):
            echo("some runs failed; their errors are in the table and the JSON")
    echo(f"done in {time.perf_counter() - t_start:.0f} s")
    return 1 if any(r.get("error") for r in doc["runs"]) else 0


def _job_size(ranks: int | None) -> int:
    if ranks is not None:
        return ranks
    from feedline_tools.bench.worker import world_comm

    comm = world_comm()
    return comm.Get_size() if comm is not None else 1


def _echo(msg: str) -> None:
    print(msg, flush=True)


def _silent(msg: str) -> None:
    """Ranks other than 0 of a job started under mpiexec print nothing."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``feedline demo``."""
    p = sub.add_parser(
        "demo",
        help="the LMDB baseline and feedline's presets side by side (under 2 minutes)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--samples",
        type=int,
        default=None,
        metavar="N",
        help=f"records in the generated LMDB (default {DEFAULT_SAMPLES:,}; "
        f"{QUICK_SAMPLES:,} with --quick)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        metavar="B",
        help=f"global batch (default {DEFAULT_BATCH}; {QUICK_BATCH} with --quick)",
    )
    p.add_argument("--ranks", type=int, default=4, metavar="N", help="MPI ranks (default 4)")
    p.add_argument("--nodes", type=int, default=2, metavar="M", help="emulated nodes (default 2)")
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        metavar="R",
        help="repeats per run, median reported (default 3; 1 with --quick)",
    )
    p.add_argument(
        "--presets",
        default=None,
        metavar="LIST",
        help="comma-separated Loader presets instead of the LMDBIO ladder and "
        "feedline (the lmdb baseline is always run)",
    )
    p.add_argument(
        "--no-cursor", action="store_true", help="leave out the liblmdb cursor reference row"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny dataset, one repeat (a smoke test, seconds not minutes)",
    )
    p.add_argument("--seed", type=int, default=0, help="dataset and shuffle seed (default 0)")
    p.add_argument(
        "--cache",
        metavar="DIR",
        default=None,
        help="where the dataset is kept and reused (default "
        "$FEEDLINE_CACHE_DIR/demo, i.e. ~/.cache/feedline/demo)",
    )
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="generate into a temporary directory removed afterwards",
    )
    p.add_argument("--fresh", action="store_true", help="regenerate the cached dataset")
    p.add_argument(
        "--path",
        metavar="P",
        default=None,
        help="use this LMDB instead of generating one ({node} = node index), "
        "with no emulator; e.g. a dataset on cluster storage, where the demo may also "
        "be started by mpiexec or srun",
    )
    p.add_argument(
        "--no-emulator",
        action="store_true",
        help="read the local disk even when the storage emulator could run",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        default="feedline-demo",
        help="directory for the full table, JSON and plots (default feedline-demo)",
    )
    p.add_argument(
        "--json",
        metavar="PATH",
        default=None,
        help="write the JSON document here instead of DIR/demo.json",
    )
    add_plot_arguments(p)
    p.set_defaults(func=run)


__all__ = [
    "add_parser",
    "build_runs",
    "demo_presets",
    "ensure_dataset",
    "run",
    "storage",
    "summary_table",
]
