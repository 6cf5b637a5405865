# SPDX-License-Identifier: Apache-2.0
"""``feedline bench lmdbio``: the LMDBIO microbenchmark (journal §5.1) on this machine.

Read-only iterations as Caffe would run them, without the training: the global batch
is split across the ranks and every preset — the Caffe/LMDB baseline (``lmdb``), the
six cumulative LMDBIO optimizations and MPI-Caffe's two patterns — runs side by side
through the harness on the same LMDB, each from a cold cache (the files are evicted,
and any storage emulator's node caches dropped, before every run), repeated and set
against the physical limit measured in the same job. Per preset: read time, bandwidth,
ratio to ``lmdb``, fraction of the limit, and the breakdown LMDBIO plots — time in seek
(walking the tree), in I/O, and skew (waiting for other ranks: node meetings, cursor
hand-offs, tokens) — with storage bytes and operations, redundant bytes, bytes
speculation read for nothing, context switches and peak memory, and, through the
storage emulator, the bytes and requests the storage actually served.

Without ``--path`` a ``cifar10-large`` LMDB of ``--samples`` records is generated in a
temporary directory; ``--path`` names an LMDB (generated there when missing, unless the
path has ``{node}``, e.g. the per-node views of ``feedline emulate up``).

Artefacts in ``--out``: ``lmdbio.md``/``lmdbio.json`` (the harness table and document),
``lmdbio-summary.md`` (the LMDBIO breakdown table below, also under ``"lmdbio"`` in
the JSON) and ``lmdbio-time.png``, ``lmdbio-breakdown.png``, ``lmdbio-ctx_switches.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from collections import Counter
from typing import Any

from feedline.errors import ConfigError
from feedline.sources.lmdbio import PRESETS
from feedline.units import count_at_least as at_least
from feedline_tools.bench import report
from feedline_tools.bench.harness import (
    RunSpec,
    add_common_arguments,
    exit_code,
    is_root,
    run_scenario,
)
from feedline_tools.bench.runners import DatasetSpec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("lmdbio")
    g.add_argument(
        "--samples",
        type=at_least(1),
        default=None,
        metavar="N",
        help="records of the generated cifar10-large LMDB (default 200000; 600 with --quick)",
    )
    g.add_argument(
        "--batch-size",
        type=at_least(1),
        default=None,
        metavar="B",
        help="global batch in records (default 2048; 64 with --quick)",
    )
    g.add_argument(
        "--presets",
        default=",".join([*PRESETS, "feedline"]),
        metavar="LIST",
        help="presets to compare: any Loader preset (default: the LMDBIO/MPI-Caffe ladder and "
        "feedline's default)",
    )
    g.add_argument(
        "--readers-per-node",
        type=int,
        default=None,
        metavar="K",
        help="LMDBIO root readers per node (default: 1 up to 16 ranks per node, 2 beyond)",
    )
    g.add_argument(
        "--stagger",
        type=int,
        default=None,
        metavar="N",
        help="staggering group size of the STAG preset (default: half the readers)",
    )
    g.add_argument("--keep-data", action="store_true", help="keep the generated LMDB")
    add_common_arguments(parser)


def _knobs(preset: str, args: argparse.Namespace) -> dict[str, Any]:
    k: dict[str, Any] = {}
    if args.readers_per_node is not None and preset.startswith("lmm"):
        k["readers_per_node"] = args.readers_per_node
    if args.stagger is not None and preset.endswith("stag"):
        k["stagger"] = args.stagger
    return k


def _mean(xs: list[Any]) -> float | None:
    v = [x for x in xs if isinstance(x, int | float)]
    return sum(v) / len(v) if v else None


def summarize(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per preset: the LMDBIO figures from the harness document (readers' means
    for seek/io, every rank's in-source skew, totals for bytes and switches)."""
    rows = []
    digests: dict[tuple[Any, ...], str | None] = {}
    lim_s = (doc.get("limit") or {}).get("seconds")

    def order_of(r: dict[str, Any]) -> tuple[Any, ...]:
        # runs of one order: the ladder's strided presets, COAL and STAG; a preset whose
        # plan is its own (feedline, its tiles or store) has no order key of the ladder
        p = r["params"]
        keys = ("region", "store", "chunk", "chunk_layout", "memory_fraction")
        return (p.get("assignment") or r["name"], *(p.get(k) for k in keys))

    shared = Counter(order_of(r) for r in doc["runs"])
    for r in doc["runs"]:
        extra = r["stats"].get("extra") or [{}] * r["ranks"]
        # the ladder's sources say which ranks read; where no rank says (every rank reads
        # its own share: direct, the store), a rank that read storage is a reader
        says = any(e and "reader" in e for e in extra)
        readers = [
            e
            for e in extra
            if e and (e.get("reader") if says else int(e.get("storage_bytes") or 0) > 0)
        ]
        emu = r["stats"].get("emulator") or []  # what the storage emulator served

        def total(key: str, extra: list[Any] = extra) -> int:
            return sum(int(e.get(key) or 0) for e in extra if e)

        def redundant(extra: list[Any] = extra) -> int:
            # bytes read beyond the samples: the source's own count (cursor walks, holes),
            # else what it read from storage less what it delivered
            return sum(
                int(e["redundant_bytes"])
                if e.get("redundant_bytes") is not None
                else max(0, int(e.get("storage_bytes") or 0) - int(e.get("payload_bytes") or 0))
                for e in extra
                if e
            )

        assign = order_of(r)
        digests.setdefault(assign, r["digest"])
        rows.append(
            {
                "preset": r["name"],
                "what": report.describe_run(r["name"]),
                "shuffles": report.shuffle_cell(r),
                "time_s": r["time_s"],
                "MBps": r["MBps"],
                "ratio_to_lmdb": r["ratio_to_baseline"],
                "fraction_of_limit": r["fraction_of_limit"],
                # the limit's time to read the dataset's files over this run's time
                "files_vs_limit": (
                    lim_s / r["time_s"] if lim_s and r["time_s"] and not r["error"] else None
                ),
                "readers": len(readers),
                "seek_s": _mean([e.get("seek_s") for e in readers]),
                "io_s": _mean([e.get("io_s") for e in readers]),
                "skew_s": _mean([e.get("skew_s") for e in extra if e]),
                "job_skew_s": _mean(r["stats"]["skew_s"]),
                "storage_bytes": total("storage_bytes"),
                "storage_ops": total("storage_ops"),
                "redundant_bytes": redundant(),
                "spec_extra_bytes": total("spec_extra_bytes"),
                "served_bytes": (
                    sum(int(e.get("bytes") or 0) for e in emu if e) if any(emu) else None
                ),
                "served_requests": (
                    sum(int(e.get("requests") or 0) for e in emu if e) if any(emu) else None
                ),
                "ctx_switches": sum(v or 0 for v in r["stats"]["ctx_switches"]),
                "peak_rss_bytes": max((v or 0 for v in r["stats"]["peak_rss_bytes"]), default=0),
                # the same bytes as the first run of the same order (None: no other run
                # has this order, so there is nothing to compare)
                "same_bytes_as_same_order": (
                    r["digest"] == digests[assign] if r["digest"] and shared[assign] > 1 else None
                ),
                "error": r.get("error"),
            }
        )
    return rows


def _pct(x: Any) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def summary_table(doc: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The LMDBIO breakdown as Markdown."""

    def f(x: Any, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    lim = doc.get("limit_MBps")
    note = (doc.get("limit") or {}).get("note")
    cfg = doc.get("config") or {}
    served = any(r["served_bytes"] is not None for r in rows)
    out = [
        f"### lmdbio: {cfg.get('ranks')} ranks, {cfg.get('nodes')} nodes, batch "
        f"{cfg.get('batch_size')}, physical limit {f(lim, '.0f')} MB/s\n"
        + (f"\nnote: {note}\n" if note else ""),
        "| preset | what it is | shuffles? | time s | MB/s | vs lmdb | of limit | files vs limit "
        "| readers | seek s | I/O s | skew s "
        "| storage MB | ops | redundant MB | spec. extra MB | ctx switches | peak RSS MiB |"
        + (" served MB | served requests |" if served else ""),
        "|" + "---|" * (20 if served else 18),
    ]
    for r in rows:
        out.append(
            "| "
            + " | ".join(
                [
                    r["preset"],
                    r["what"],
                    r["shuffles"],
                    f(r["time_s"], ".2f") if not r["error"] else f"error: {r['error']}",
                    f(r["MBps"], ".0f"),
                    f(r["ratio_to_lmdb"], ".2f"),
                    _pct(r["fraction_of_limit"]),
                    _pct(r.get("files_vs_limit")),
                    str(r["readers"]),
                    f(r["seek_s"], ".3f"),
                    f(r["io_s"], ".3f"),
                    f(r["skew_s"], ".3f"),
                    f(r["storage_bytes"] / 1e6, ".0f"),
                    f(r["storage_ops"], "d"),
                    f(r["redundant_bytes"] / 1e6, ".1f"),
                    f(r["spec_extra_bytes"] / 1e6, ".1f"),
                    f(r["ctx_switches"], "d"),
                    f(r["peak_rss_bytes"] / 2**20, ".0f"),
                ]
                + (
                    [
                        f(None if r["served_bytes"] is None else r["served_bytes"] / 1e6, ".0f"),
                        f(r["served_requests"], "d"),
                    ]
                    if served
                    else []
                )
            )
            + " |"
        )
    best = max((r for r in rows if r["MBps"]), key=lambda r: r["MBps"], default=None)
    if best is not None:
        of = _pct(best["fraction_of_limit"])
        out.append(
            f"\nbest: {best['preset']} at {best['MBps']:.0f} MB/s = "
            f"{f(best['ratio_to_lmdb'], '.2f')}x lmdb, {of} of the physical limit"
            + (
                f" (its files at {_pct(best.get('files_vs_limit'))} of the limit's speed)"
                if best.get("files_vs_limit")
                else ""
            )
        )
    if any((r.get("files_vs_limit") or 0) > 1 for r in rows):
        out.append(
            "\nfiles vs limit above 100%: the run read the files faster than the limit run, "
            "in which each rank reads its share with large sequential direct reads one at a "
            "time (what IOR or fio report); a plan with more reads in flight can beat it"
        )
    diff = [r["preset"] for r in rows if r["same_bytes_as_same_order"] is False]
    if diff:
        out.append(f"\ndelivery differs from the first preset with the same order: {diff}")
    return "\n".join(out) + "\n"


def _dataset(args: argparse.Namespace, samples: int, tmp: list[str]):
    def make() -> DatasetSpec:
        from feedline_tools.make import generate

        path = args.path
        if path is None:
            tmp.append(tempfile.mkdtemp(prefix="feedline-lmdbio-"))
            path = os.path.join(tmp[0], "cifar10_large_lmdb")
        if "{node}" not in path and not os.path.exists(os.path.join(path, "data.mdb")):
            generate("cifar10-large", path, samples=samples, seed=0, progress=False)
        elif "{node}" in path and not os.path.exists(path.replace("{node}", "0")):
            raise ConfigError(f"--path {path!r}: no LMDB at node 0's view")
        return DatasetSpec(path, "lmdb")

    return make


def run(args: argparse.Namespace) -> int:
    samples = args.samples or (600 if args.quick else 200_000)
    batch = args.batch_size or (64 if args.quick else 2048)
    names = [p for p in args.presets.split(",") if p]
    from feedline.plan.strategy import PRESET_DOCS, get_strategy
    from feedline.plan.strategy import PRESETS as ALL_PRESETS

    unknown = [p for p in names if p not in ALL_PRESETS]
    if unknown:
        raise ConfigError(f"--presets: unknown presets {unknown}; known: {', '.join(ALL_PRESETS)}")

    runs = []
    for p in names:
        st = get_strategy(p, **{k: v for k, v in _knobs(p, args).items() if k != "stagger"})
        runs.append(
            RunSpec(
                p,
                f"loader:{p}",
                _knobs(p, args),
                {"paper": PRESET_DOCS.get(p), "assignment": st.assignment, "region": st.region},
            )
        )
    if args.baseline is None:
        args.baseline = "lmdb" if "lmdb" in names else names[0]
    tmp: list[str] = []
    try:
        doc = run_scenario("lmdbio", runs, _dataset(args, samples, tmp), args, batch_size=batch)
    finally:
        if not args.keep_data:
            for d in tmp:
                shutil.rmtree(d, ignore_errors=True)
    if doc is None or not is_root():
        return exit_code(doc)
    rows = summarize(doc)
    table = summary_table(doc, rows)
    print(table)
    doc["lmdbio"] = rows
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "lmdbio-summary.md"), "w") as f:
            f.write(table)
    path = args.json or (os.path.join(args.out, "lmdbio.json") if args.out else None)
    if path:
        report.write_json(json.loads(json.dumps(doc)), path)
    return exit_code(doc)
