# SPDX-License-Identifier: Apache-2.0
"""``feedline plan``: the I/O plan of any preset at any world size, without I/O.

    feedline plan --ranks 9216 --nodes 256 --preset all --batch 18432 \\
        --samples 50000000 --sample-bytes 3072 --layout lmdb

prints, per preset, the readers, how many read at once, bytes and operations per reader,
the largest and smallest read, the bytes read for nothing (cursor walks of seeking
presets, holes read through) and the randomization level. ``PATH`` plans over a real
dataset's index instead of a synthetic layout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import Any

from ..errors import ConfigError
from ..units import count_at_least, parse_bytes
from .plan import make_plan
from .strategy import PRESET_DOCS, PRESETS, get_strategy
from .world import WorldSpec


def _size(text: str) -> int:
    try:
        return parse_bytes(text, "a size")
    except (ConfigError, ValueError) as e:  # argparse names the option
        raise argparse.ArgumentTypeError(str(e).removeprefix("a size: ")) from None


_positive = count_at_least(1)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "plan",
        help="I/O plan statistics of presets for any world size (no I/O)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", nargs="?", help="dataset to plan over (its index is read)")
    p.add_argument("--format", default=None, help="dataset format when PATH is ambiguous")
    p.add_argument(
        "--record-bytes", type=_positive, default=None, help="records format: bytes per record"
    )
    p.add_argument("--ranks", type=_positive, default=1, help="MPI ranks P (default 1)")
    p.add_argument("--nodes", type=_positive, default=1, help="nodes M (default 1)")
    p.add_argument("--preset", default="all", help="preset name, comma list, or 'all' (default)")
    p.add_argument(
        "--batch", type=_positive, default=None, help="global batch (default 2 per rank)"
    )
    p.add_argument("--samples", type=_positive, default=None, help="synthetic: number of records")
    p.add_argument(
        "--sample-bytes", type=_positive, default=3072, help="synthetic: bytes per record"
    )
    p.add_argument(
        "--layout", choices=("lmdb", "flat"), default="lmdb", help="synthetic file layout"
    )
    p.add_argument("--key-bytes", type=int, default=8, help="synthetic LMDB key length")
    p.add_argument(
        "--memory-cap",
        type=_size,
        default=None,
        help="bytes per node for read buffers, e.g. 64MiB, 2G, 2.5e9 (default: feedline's "
        "memory cap; a Loader gives its planner its memory_cap less the read-ahead batches "
        "and the index)",
    )
    p.add_argument(
        "--profile",
        default=None,
        help="storage profile for the feedline preset's cost model: parallel (default for "
        "a synthetic layout), local, memory, or a JSON file from `feedline probe --json`; "
        "with PATH the default is the probed or typical profile of its file system",
    )
    p.add_argument(
        "--explain",
        action="store_true",
        help="print the cost model's estimate of the chosen feedline plan and the runners-up",
    )
    p.add_argument(
        "--epochs",
        type=_positive,
        default=None,
        help="epochs the job will read, for the feedline preset's cost model (the Loader's "
        "epochs=; default unknown: the DeepIO store is weighed over 3)",
    )
    p.add_argument(
        "--cores-per-node",
        type=_positive,
        default=None,
        help="cores of a host, for the cost model's cpu term (default: one per rank, a "
        "cluster's placement; fewer than the host's ranks makes them take turns)",
    )
    p.add_argument(
        "--ranks-per-host",
        type=_positive,
        default=None,
        help="ranks sharing one host's cores (default: a node's; all --ranks for emulated "
        "nodes on one machine, as a Loader under FEEDLINE_NODES counts them)",
    )
    p.add_argument(
        "--decode",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="whether the Loader decodes the records, which the cpu term counts (default: "
        "the dataset's choice with PATH, raw bytes without)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON ('-' = stdout)")
    p.set_defaults(func=run)
    return p


def _records(args):
    if args.path:
        from ..dataset import open_dataset
        from .records import as_records

        opts = {"record_bytes": args.record_bytes} if args.record_bytes else {}
        ds = open_dataset(args.path, format=getattr(args, "format", None), **opts)
        idx = ds.index
        args._decodes = bool(getattr(ds, "decodes", False))  # the Loader's default decode
        return as_records(idx), f"{args.path} ({ds.format}, {len(idx)} records)", idx
    if not args.samples:
        raise ConfigError("give a dataset PATH or --samples N (with --sample-bytes, --layout)")
    if args.layout == "lmdb":
        from .lmdb_model import LmdbModel

        m = LmdbModel(args.samples, args.sample_bytes, key=args.key_bytes)
        how = "overflow pages" if m.overflow else f"{m.per_leaf} per leaf"
        return (
            m,
            f"synthetic LMDB: {args.samples} x {args.sample_bytes} B ({how}, {_fmt_bytes(m.file_bytes)})",
            None,
        )
    from .records import FlatRecords

    flat = FlatRecords(args.samples, args.sample_bytes)
    return flat, f"flat: {args.samples} x {args.sample_bytes} B", None


def _fmt_bytes(x: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(x) < 1000 or unit == "PB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1000
    return str(x)  # pragma: no cover


def compute(args) -> dict[str, Any]:
    """All figures for the command line arguments (importable for tests and the bench)."""
    from .stats import plan_stats

    records, what, index = _records(args)
    world = WorldSpec(args.ranks, args.nodes)
    batch = args.batch or 2 * args.ranks
    names = list(PRESETS) if args.preset == "all" else [s.strip() for s in args.preset.split(",")]
    cap = None if args.memory_cap is None else int(args.memory_cap)
    from .. import defaults
    from ..sources.store_plan import checked_choice
    from .cost import DECODE_RECORD_S, choose, get_profile

    profile = get_profile(getattr(args, "profile", None), args.path)
    per_host = getattr(args, "ranks_per_host", None) or -(-args.ranks // max(args.nodes, 1))
    cores = getattr(args, "cores_per_node", None) or per_host
    host = (min(per_host, args.ranks), cores)
    decode = getattr(args, "decode", None)
    if decode is None:  # a Loader's default: the dataset's choice
        decode = bool(getattr(args, "_decodes", False))
    rec_cpu = DECODE_RECORD_S if decode else 0.0
    rows = []
    choice = None
    for name in names:
        t0 = time.perf_counter()
        strategy = get_strategy(name)
        if strategy.auto:
            cargs = (records, world, batch, int(defaults.get("memory_cap")) if cap is None else cap)

            def pick(why, base=strategy, cargs=cargs):
                return choose(
                    *cargs,
                    profile,
                    base=base,
                    epochs=args.epochs,
                    store=why,
                    host=host,
                    record_cpu_s=rec_cpu,
                )

            # with a dataset, the store's exact slots are checked as the Loader does
            choice = checked_choice(pick, True, index, cargs, args.seed, strategy.store)
            strategy = choice.strategy
        plan = make_plan(records, world, strategy, args.seed, args.epoch, batch, memory_cap=cap)
        row = plan_stats(plan, name)
        row["plan_seconds"] = time.perf_counter() - t0
        row["requests_total"] = row["ops_per_reader"] * row["readers"]
        row["mean_read"] = row["bytes_per_reader"] / max(row["ops_per_reader"], 1e-9)
        if choice is not None and strategy is choice.strategy:
            row["estimate"] = choice.best.to_dict()
        rows.append(row)
    out = {
        "dataset": what,
        "ranks": args.ranks,
        "nodes": args.nodes,
        "batch": batch,
        "profile": profile.to_dict(),
        "presets": rows,
    }
    if choice is not None:
        out["choice"] = choice.to_dict()
        out["_explain"] = choice.explain()
    return out


def run(args) -> int:
    t0 = time.perf_counter()
    out = compute(args)
    # with --json - the JSON alone goes to stdout (for a pipe), the table to stderr
    with contextlib.redirect_stdout(sys.stderr) if args.json == "-" else contextlib.nullcontext():
        _print_table(args, out, t0)
    if args.json:
        text = json.dumps(out, indent=1, sort_keys=True)
        if args.json == "-":
            sys.stdout.write(text + "\n")
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    return 0


def _sampled(rows: list[dict[str, Any]]) -> str:
    """How many readers each preset's figures come from: one count, or one per preset."""
    counts = {r["preset"]: r["sampled_readers"] for r in rows}
    if len(set(counts.values())) <= 1:
        return f"{next(iter(counts.values()), 0)} sampled readers per preset"
    return "sampled readers " + ", ".join(f"{p} {n}" for p, n in counts.items())


def _print_table(args, out: dict[str, Any], t0: float) -> None:
    rows = out["presets"]
    print(
        f"{out['dataset']}; {out['ranks']} ranks on {out['nodes']} nodes, global batch {out['batch']}"
    )
    head = (
        f"{'preset':<24}{'readers':>8}{'at once':>8}{'per reader':>12}{'ops/reader':>12}"
        f"{'largest':>10}{'smallest':>10}{'redundant':>12}{'steps/read':>11}{'RL':>6}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['preset']:<24}{r['readers']:>8}{r['concurrent_readers']:>8}"
            f"{_fmt_bytes(r['bytes_per_reader']):>12}{r['ops_per_reader']:>12.0f}"
            f"{_fmt_bytes(r['largest_read']):>10}{_fmt_bytes(r['smallest_read']):>10}"
            f"{_fmt_bytes(r['redundant_bytes_total']):>12}{r['steps_per_read']:>11}{r['rl']:>6.2f}"
        )
    print(
        f"redundant = bytes read beyond the samples, all readers (cursor walks, holes read through); "
        f"figures from {_sampled(rows)}; "
        f"{time.perf_counter() - t0:.1f} s"
    )
    if len(rows) == 1:
        print(f"{rows[0]['preset']}: {PRESET_DOCS.get(rows[0]['preset'], '')}")
    explain = out.pop("_explain", None)
    if explain and getattr(args, "explain", False):
        print()
        print(explain)
