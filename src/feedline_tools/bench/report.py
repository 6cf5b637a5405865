# SPDX-License-Identifier: Apache-2.0
"""Benchmark results: the JSON document, a Markdown table and PNG plots.

:func:`build_document` reduces the raw per-rank, per-repeat figures of a job to the
document docs/benchmarks.md describes ("The result document") (``{"scenario", "limit_MBps", "baseline", "runs": [...]}``):
a run's time is the median over repeats of the job time (the slowest rank; the lower
median for an even count, so it is one real repeat), its other figures come from that
repeat, and each rank's *skew* is how long it waited for
the slowest one. Plots are separate functions, each drawn only when the data supports
it, so a scenario gets exactly the figures its runs can fill.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from feedline.errors import ConfigError

#: the reference row of the LMDB benchmarks: one liblmdb cursor per rank, no Loader
CURSOR = "liblmdb-cursor"

#: short "what it is" of each run, in plain words, for every printed table
ROWS = {
    "lmdb": "every rank walks LMDB with its own cursor (Caffe)",
    "lmm": "one reader per node walks LMDB, shares a node buffer",
    "lmm-dm": "+ guesses pages ahead, prefetches them in parallel",
    "lmm-dio": "+ one process walks, readers use plain reads",
    "lmm-dio-prov": "+ knows where each record is: no walking",
    "lmm-dio-prov-coal": "+ reads many future steps in one large read",
    "lmm-dio-prov-coal-stag": "+ nodes take turns reading",
    "feedline": "feedline: shuffled tiles, or the in-memory store",
    "skip": "rank r reads records r, r+P, ... (MPI-Caffe)",
    "contiguous": "each rank reads its own region (MPI-Caffe fix)",
    "tf": "one read per sample, shuffled, no read-ahead",
    "tf-pre": "one read per sample, shuffled, read ahead",
    "async": "shuffled groups read by an I/O thread",
    "async-db": "shuffled groups, I/O thread, double buffer",
    "deepio-ordered": "whole dataset in the job's memory, shuffled",
    "deepio-opportunistic": "in memory, serves what is at hand first",
    CURSOR: "reference: one liblmdb cursor per rank, no Loader",
    "global": "uniform shuffle of the whole dataset (one read per sample)",
    "chunk": "shuffled groups of B consecutive samples (async-I/O paper)",
    "memory": "shuffle within R of the dataset held in memory (DeepIO)",
    "none": "file order, no shuffle",
    "torch-pread": "PyTorch DataLoader, one pread per sample",
    "torch-h5py": "PyTorch DataLoader reading each sample with h5py",
    "torch-w": "PyTorch DataLoader + h5py with {w} worker processes",
    "h5py-slices": "h5py reading each batch as contiguous slices (no per-sample calls)",
    "mmap": "sequential reads through mmap, in blocks of this size",
    "pread": "sequential pread, in blocks of this size",
    "per-sample": "one pread per sample, in file order",
}
#: runs that deliver the file's order (no shuffle) whatever their RL says
_FILE_ORDER = ("lmdb", "skip", "contiguous", CURSOR)


def describe_run(name: str) -> str:
    """The plain-words description of run *name* (``"tf-pre B=64"`` -> that of
    ``tf-pre``), or ``"-"``."""
    for cand in (
        name,
        name.split(" ", 1)[0],
        name.rsplit(":", 1)[-1],  # loader:tf, loader-timed:async
        name.rstrip("0123456789"),  # torch-w4
        name.rsplit("-", 1)[0],  # mmap-8M
    ):
        if cand in ROWS:
            workers = name[len(cand) :] if cand == "torch-w" else ""
            return ROWS[cand].replace("{w}", workers or "w")
    return "-"


def shuffle_cell(r: dict[str, Any]) -> str:
    """The "shuffles?" cell: 'no' for file order, else 'yes' with DeepIO's
    randomization level (RL, 0 = file order, 1 = uniform shuffle)."""
    rl = r.get("rl")
    name = str(r.get("name", ""))
    if rl is None or rl != rl:
        base = name.split(" ", 1)[0]
        return "no" if base in _FILE_ORDER or base.startswith("lmm") else "-"
    return "no" if rl < 0.05 else f"yes, RL {rl:.2f}"


def add_plot_arguments(group: Any) -> None:
    """``--plots`` (PNG plots, needs matplotlib: only then is it imported); plots are
    off by default. ``--no-plots`` is still accepted. Sets ``args.no_plots``."""
    group.add_argument(
        "--plots",
        dest="no_plots",
        action="store_false",
        help="also write PNG plots (needs matplotlib: pip install 'feedline[plots]')",
    )
    group.add_argument("--no-plots", dest="no_plots", action="store_true", help=argparse.SUPPRESS)
    group.set_defaults(no_plots=True)


#: per-rank figures kept in ``run["stats"]`` (lists indexed by rank)
RANK_STATS = (
    "time_s",
    "seek_s",
    "io_s",
    "skew_s",
    "exposed_io_s",
    "payload_bytes",
    "storage_bytes",
    "storage_ops",
    "ctx_switches",
    "ctx_voluntary",
    "ctx_involuntary",
    "major_faults",
    "proc_read_bytes",
    "peak_rss_bytes",
)

_NUM = {"type": ["number", "null"]}
#: JSON Schema of the document (the contract scenario authors and plots rely on)
SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["scenario", "limit_MBps", "baseline", "runs"],
    "properties": {
        "scenario": {"type": "string"},
        "limit_MBps": _NUM,
        "baseline": {"type": ["string", "null"]},
        "runs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": [
                    "name",
                    "ranks",
                    "nodes",
                    "time_s",
                    "payload_bytes",
                    "MBps",
                    "fraction_of_limit",
                    "ratio_to_baseline",
                    "exposed_io_s",
                    "rl",
                    "digest",
                    "stats",
                ],
                "properties": {
                    "name": {"type": "string"},
                    "ranks": {"type": "integer", "minimum": 1},
                    "nodes": {"type": "integer", "minimum": 1},
                    "time_s": _NUM,
                    "payload_bytes": {"type": "integer", "minimum": 0},
                    "MBps": _NUM,
                    "fraction_of_limit": _NUM,
                    "ratio_to_baseline": _NUM,
                    "exposed_io_s": _NUM,
                    "rl": _NUM,
                    "digest": {"type": ["string", "null"], "pattern": "^[0-9a-f]{64}$"},
                    "stats": {
                        "type": "object",
                        "required": list(RANK_STATS),
                        "additionalProperties": True,
                    },
                },
            },
        },
    },
}


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def _median_index(values: list[float]) -> int:
    order = sorted(range(len(values)), key=values.__getitem__)
    return order[(len(order) - 1) // 2]


def _limit_summary(limits: list[Any], cfg: dict[str, Any]) -> dict[str, Any]:
    per_repeat: list[float] = []
    seconds: list[float] = []
    read: list[int] = []
    methods: set[str] = set()
    errors: list[str] = []
    for ranks in limits:
        if not ranks:
            continue
        methods.update(r["method"] for r in ranks)
        errors += [r["error"] for r in ranks if r.get("error")]
        t = max(r["seconds"] for r in ranks)
        b = sum(r["bytes"] for r in ranks)
        if t > 0 and b > 0 and not any(r.get("error") for r in ranks):
            per_repeat.append(b / t / 1e6)
            seconds.append(t)
            read.append(b)
    opt = cfg.get("limit") or {}
    return {
        "MBps": statistics.median(per_repeat) if per_repeat else None,
        "repeats_MBps": per_repeat,
        # the files, read at the limit: a run's time against this is how close it came to
        # the storage's speed, whatever share of the files its payload is (LMDB pages)
        "seconds": statistics.median(seconds) if seconds else None,
        "bytes": int(statistics.median(read)) if read else None,
        "method": "/".join(sorted(methods)) or None,
        "block_bytes": int(opt.get("block", 8 << 20)),
        "error": errors[0] if errors else None,
    }


def _run_summary(spec: dict[str, Any], reps: list[Any], world: Any, limit: float | None) -> dict:
    job_times = [max(r["time_s"] for r in rep["ranks"]) for rep in reps]
    k = _median_index(job_times)
    ranks = reps[k]["ranks"]
    job = job_times[k]
    errors = [r["error"] for rep in reps for r in rep["ranks"] if r.get("error")]
    stats: dict[str, Any] = {}
    for key in RANK_STATS:
        if key == "skew_s":
            stats[key] = [job - r["time_s"] for r in ranks]
        else:
            stats[key] = [r.get(key) for r in ranks]
    stats["node"] = [r["node"] for r in ranks]
    emu = [r.get("emulator") for r in ranks]
    if any(emu):
        stats["emulator"] = emu
    extra = [r.get("extra") for r in ranks]
    if any(extra):
        stats["extra"] = extra
    payload = int(sum(r.get("payload_bytes") or 0 for r in ranks))
    mbps = payload / job / 1e6 if job > 0 and not errors else None
    digests = [rep["digest"] for rep in reps]
    exposed = [r.get("exposed_io_s") for r in ranks if r.get("exposed_io_s") is not None]
    rls = [r.get("rl") for r in ranks if r.get("rl") is not None]
    return {
        "name": spec["name"],
        "runner": spec["runner"],
        "options": spec.get("options") or {},
        "params": spec.get("params") or {},
        "ranks": world.size,
        "nodes": world.nodes,
        "time_s": None if errors else job,
        "times_s": job_times,
        "payload_bytes": payload,
        "MBps": mbps,
        "fraction_of_limit": mbps / limit if mbps is not None and limit else None,
        "ratio_to_baseline": None,
        "exposed_io_s": max(exposed) if exposed and not errors else None,
        "rl": rls[0] if rls else None,
        "digest": digests[k],
        "digests_agree": len(set(digests)) == 1,
        "error": errors[0] if errors else None,
        "stats": stats,
    }


def build_document(
    cfg: dict[str, Any], world: Any, limits: list[Any], samples: dict[str, list[Any]]
) -> dict[str, Any]:
    """The result document from the raw figures gathered on rank 0.

    ``ratio_to_baseline`` is the run's bandwidth over the baseline's (> 1: faster than
    the baseline; equal to the time ratio when both deliver the same bytes).
    """
    lim = _limit_summary(limits, cfg)
    runs = [_run_summary(spec, samples[spec["name"]], world, lim["MBps"]) for spec in cfg["runs"]]
    best = max((r["MBps"] for r in runs if r["MBps"] is not None), default=None)
    if lim["MBps"] is not None and best is not None and best > lim["MBps"]:
        # a run beat the limit measured in the same job (page cache, a short --quick
        # run, read-ahead): no figure may exceed 100%, so the limit is the best seen
        lim["measured_MBps"] = lim["MBps"]
        lim["MBps"] = best
        lim["note"] = (
            f"the limit run measured {lim['measured_MBps']:.0f} MB/s, below the best run "
            f"({best:.0f} MB/s: cache or read-ahead effects); the limit is raised to it"
        )
        for r in runs:
            if r["MBps"] is not None:
                r["fraction_of_limit"] = r["MBps"] / best
    baseline = cfg.get("baseline") or (runs[0]["name"] if runs else None)
    base = next((r for r in runs if r["name"] == baseline), None)
    if base is None and baseline is not None:
        raise ConfigError(
            f"baseline {baseline!r} is not one of the runs {[r['name'] for r in runs]}"
        )
    for r in runs:
        if base is not None and r["MBps"] is not None and base["MBps"]:
            r["ratio_to_baseline"] = r["MBps"] / base["MBps"]
    doc = {
        "scenario": cfg["scenario"],
        "limit_MBps": lim["MBps"],
        "baseline": baseline,
        "runs": runs,
        "limit": lim,
        "config": {
            k: cfg.get(k)
            for k in (
                "dataset",
                "batch_size",
                "steps",
                "compute_ms",
                "repeats",
                "seed",
                "assignment",
            )
        }
        | {"ranks": world.size, "nodes": world.nodes},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    return _finite(doc)


def validate(doc: dict[str, Any]) -> None:
    """Raise ConfigError when *doc* does not follow :data:`SCHEMA`'s required shape."""

    def need(obj: dict, keys, where: str) -> None:
        missing = [k for k in keys if k not in obj]
        if missing:
            raise ConfigError(f"{where}: missing {missing}")

    need(doc, SCHEMA["required"], "document")
    item = SCHEMA["properties"]["runs"]["items"]
    for i, run in enumerate(doc["runs"]):
        need(run, item["required"], f"runs[{i}]")
        need(run["stats"], RANK_STATS, f"runs[{i}].stats")
        for key in RANK_STATS:
            if len(run["stats"][key]) != run["ranks"]:
                raise ConfigError(f"runs[{i}].stats.{key}: one value per rank expected")


# ------------------------------------------------------------------------ table


def _size_label(n: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def _fmt(x: Any, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def _agg(values: list[Any], fn: Callable = max) -> Any:
    vals = [v for v in values if v is not None]
    return fn(vals) if vals else None


def markdown_table(doc: dict[str, Any]) -> str:
    """The runs side by side, one row each (seconds are the slowest rank's)."""
    lim = doc.get("limit_MBps")
    note = (doc.get("limit") or {}).get("note")
    head = (
        f"### {doc['scenario']}\n\nphysical limit: {_fmt(lim, '.1f')} MB/s"
        f" ({(doc.get('limit') or {}).get('method') or 'not measured'}); baseline: "
        f"{doc.get('baseline')}\n\n" + (f"note: {note}\n\n" if note else "")
    )
    cols = [
        "run",
        "what it is",
        "shuffles?",
        "ranks",
        "nodes",
        "time s",
        "MB/s",
        "of limit",
        "vs baseline",
        "exposed I/O s",
        "seek s",
        "io s",
        "skew s",
        "ctx switches",
        "peak RSS MiB",
        "RL",
        "digest",
    ]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in doc["runs"]:
        st = r["stats"]
        rss = _agg(st["peak_rss_bytes"])
        frac = r["fraction_of_limit"]
        row = [
            r["name"],
            describe_run(r["name"]),
            shuffle_cell(r),
            str(r["ranks"]),
            str(r["nodes"]),
            _fmt(r["time_s"]),
            _fmt(r["MBps"], ".1f"),
            "-" if frac is None else f"{100 * frac:.0f}%",
            _fmt(r["ratio_to_baseline"], ".2f"),
            _fmt(r["exposed_io_s"]),
            _fmt(_agg(st["seek_s"])),
            _fmt(_agg(st["io_s"])),
            _fmt(_agg(st["skew_s"])),
            _fmt(_agg(st["ctx_switches"], sum), "d"),
            _fmt(None if rss is None else rss / 2**20, ".0f"),
            _fmt(r["rl"], ".3f"),
            (r["digest"] or "-")[:12],
        ]
        if r.get("error"):
            row[5] = f"error: {r['error']}"
        lines.append("| " + " | ".join(row) + " |")
    agree = [r["name"] for r in doc["runs"] if r.get("digests_agree") is False]
    note = f"\n\ndigest changed between repeats: {', '.join(agree)}" if agree else ""
    return head + "\n".join(lines) + note + "\n"


def write_json(doc: dict[str, Any], path: str) -> str:
    """Write *doc* atomically; return the path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, allow_nan=False)
    os.replace(tmp, path)
    return path


def emit_scenario(
    doc: dict[str, Any], args: Any, name: str, text: str, plot: Callable[[], Any]
) -> None:
    """A scenario's artefacts: print its markdown *text* and write it to
    ``<args.out>/<name>.md``, *doc* to ``args.json`` or ``<args.out>/<name>.json``, and
    call *plot* unless ``args.no_plots``."""
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{name}.md"), "w") as f:
        f.write(text)
    write_json(doc, args.json or os.path.join(args.out, f"{name}.json"))
    if not args.no_plots:
        plot()


# ------------------------------------------------------------------------ plots


def _pyplot():
    try:
        import matplotlib
    except ImportError as e:
        raise ConfigError("plots need matplotlib (pip install 'feedline[plots]')") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _ok(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in doc["runs"] if r["time_s"] is not None]


def _bars(
    path: str,
    names: list[str],
    series: dict[str, list[float]],
    ylabel: str,
    title: str,
    stacked: bool = False,
    errs: list[tuple[float, float]] | None = None,
    marks: dict[str, list[float]] | None = None,
) -> str:
    plt = _pyplot()
    wide = 3.0 if len(series) + len(marks or {}) > 1 else 0.0  # room for the legend
    fig, ax = plt.subplots(figsize=(max(4.0, 0.7 * len(names) + 2) + wide, 3.6))
    x = list(range(len(names)))
    bottom = [0.0] * len(names)
    width = 0.8 if stacked or len(series) == 1 else 0.8 / len(series)
    for j, (label, vals) in enumerate(series.items()):
        if stacked:
            ax.bar(x, vals, width, bottom=bottom, label=label)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        else:
            xs = [i + (j - (len(series) - 1) / 2) * width for i in x]
            yerr = None
            if errs is not None:
                yerr = [
                    [v - lo for v, (lo, _) in zip(vals, errs, strict=True)],
                    [hi - v for v, (_, hi) in zip(vals, errs, strict=True)],
                ]
            ax.bar(xs, vals, width, label=label, yerr=yerr, capsize=3 if yerr else 0)
    for label, vals in (marks or {}).items():
        ax.scatter(x, vals, marker="_", s=400, color="black", linewidths=2, label=label, zorder=3)
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(series) + len(marks or {}) > 1:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_time(doc: dict[str, Any], path: str) -> str | None:
    """Read time per run (median of repeats, bars from min to max)."""
    runs = _ok(doc)
    if not runs:
        return None
    return _bars(
        path,
        [r["name"] for r in runs],
        {"time": [r["time_s"] for r in runs]},
        "seconds",
        f"{doc['scenario']}: read time ({runs[0]['ranks']} ranks)",
        errs=[(min(r["times_s"]), max(r["times_s"])) for r in runs],
    )


def _mean(values: list[Any]) -> float:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else 0.0


def plot_breakdown(doc: dict[str, Any], path: str) -> str | None:
    """Seek, read, other and skew seconds per run, averaged over ranks (LMDBIO's
    breakdown); a bar adds up to the job time.

    Sources that read in background threads spend more I/O thread-seconds than wall
    seconds (reads overlap each other and the consumer): their bar shows the part of the
    rank's time not spent elsewhere as I/O, and a black mark the I/O thread-seconds."""
    runs = _ok(doc)
    if not runs:
        return None
    seek, io, other, thread_io = [], [], [], []
    for r in runs:
        st = r["stats"]
        per = [
            (t or 0.0, s or 0.0, i or 0.0)
            for t, s, i in zip(st["time_s"], st["seek_s"], st["io_s"], strict=True)
        ]
        seek.append(_mean([s for _, s, _ in per]))
        io.append(_mean([min(i, max(0.0, t - s)) for t, s, i in per]))
        other.append(_mean([max(0.0, t - s - min(i, max(0.0, t - s))) for t, s, i in per]))
        thread_io.append(_mean([i for _, _, i in per]))
    if not any(seek) and not any(thread_io):
        return None
    series = {"seek": seek, "io (wall)": io, "other": other}
    # each rank's wait for the slowest rank, so that each bar adds up to the job time
    series["skew"] = [_mean(r["stats"]["skew_s"]) for r in runs]
    overlapped = [
        t if t > i * 1.05 + 1e-3 else float("nan") for t, i in zip(thread_io, io, strict=True)
    ]
    marks = {"I/O thread-seconds (background threads, overlapping)": overlapped}
    return _bars(
        path,
        [r["name"] for r in runs],
        series,
        "seconds (mean over ranks)",
        f"{doc['scenario']}: time breakdown",
        stacked=True,
        marks=marks if any(v == v for v in overlapped) else None,
    )


def plot_ctx_switches(doc: dict[str, Any], path: str) -> str | None:
    """Context switches per run, summed over ranks, voluntary and involuntary."""
    runs = _ok(doc)
    vol = [sum(v or 0 for v in r["stats"]["ctx_voluntary"]) for r in runs]
    inv = [sum(v or 0 for v in r["stats"]["ctx_involuntary"]) for r in runs]
    if not runs or not any(vol + inv):
        return None
    return _bars(
        path,
        [r["name"] for r in runs],
        {"voluntary": vol, "involuntary": inv},
        "context switches (all ranks)",
        f"{doc['scenario']}: context switches",
        stacked=True,
    )


def plot_exposed_io(doc: dict[str, Any], path: str) -> str | None:
    """Exposed I/O time (the consumer waiting for data) per run, slowest rank."""
    runs = [r for r in _ok(doc) if r["exposed_io_s"] is not None]
    if not runs:
        return None
    return _bars(
        path,
        [r["name"] for r in runs],
        {"exposed": [r["exposed_io_s"] for r in runs]},
        "seconds (slowest rank)",
        f"{doc['scenario']}: exposed I/O time",
    )


def plot_block_size(doc: dict[str, Any], path: str) -> str | None:
    """Bandwidth vs block size, one line per method (runs with ``params.block_bytes``)."""
    lines: dict[str, list[tuple[int, float]]] = {}
    for r in _ok(doc):
        bs = r["params"].get("block_bytes")
        if bs is not None and r["MBps"] is not None:
            lines.setdefault(r["params"].get("method", r["runner"]), []).append(
                (int(bs), r["MBps"])
            )
    if not lines or max(len(v) for v in lines.values()) < 2:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for method, pts in sorted(lines.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=method)
    if doc.get("limit_MBps"):
        ax.axhline(doc["limit_MBps"], color="grey", linestyle="--", label="physical limit")
    ax.set_xscale("log", base=2)
    ticks = sorted({p[0] for pts in lines.values() for p in pts})
    ax.set_xticks(ticks, [_size_label(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("block size")
    ax.set_ylabel("MB/s")
    ax.set_title(f"{doc['scenario']}: bandwidth vs block size")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_rl(doc: dict[str, Any], path: str) -> str | None:
    """Randomization level per run (runs that report one; not drawn when every order
    is sequential, RL 0)."""
    runs = [r for r in doc["runs"] if r["rl"] is not None]
    if not any(r["rl"] > 0 for r in runs):  # all sequential orders: nothing to show
        return None
    return _bars(
        path,
        [r["name"] for r in runs],
        {"RL": [r["rl"] for r in runs]},
        "randomization level",
        f"{doc['scenario']}: randomization level",
    )


PLOTS: dict[str, Callable[[dict[str, Any], str], str | None]] = {
    "time": plot_time,
    "breakdown": plot_breakdown,
    "ctx_switches": plot_ctx_switches,
    "exposed_io": plot_exposed_io,
    "block_size": plot_block_size,
    "rl": plot_rl,
}


def write_plots(doc: dict[str, Any], out_dir: str) -> list[str]:
    """Every plot the data supports, as ``OUT/<scenario>-<plot>.png``; return the paths."""
    os.makedirs(out_dir, exist_ok=True)
    made = []
    for name, fn in PLOTS.items():
        p = fn(doc, os.path.join(out_dir, f"{doc['scenario']}-{name}.png"))
        if p:
            made.append(p)
    return made


def emit(
    doc: dict[str, Any],
    *,
    out_dir: str | None,
    json_path: str | None,
    plots: bool = True,
    echo: Callable[[str], Any] = print,
) -> dict[str, Any]:
    """Print the table and write the artefacts; return ``{"table", "json", "plots"}``."""
    validate(doc)
    table = markdown_table(doc)
    echo(table)
    written: dict[str, Any] = {"table": None, "json": None, "plots": []}
    if json_path:
        written["json"] = write_json(doc, json_path)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        written["table"] = os.path.join(out_dir, f"{doc['scenario']}.md")
        with open(written["table"], "w") as f:
            f.write(table)
        if not json_path:
            written["json"] = write_json(doc, os.path.join(out_dir, f"{doc['scenario']}.json"))
        if plots:
            written["plots"] = write_plots(doc, out_dir)
    return written
