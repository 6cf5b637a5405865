# SPDX-License-Identifier: Apache-2.0
"""Peers side by side: the loaders users already run, on the same samples and storage.

The dataset is a class-sorted ``cifar10-large`` LMDB (Caffe Datums of ~3 KB, written by
``feedline make``), cached in ``$FEEDLINE_CACHE_DIR/peers/``; every peer reads a copy in
its own format made from that LMDB and cached beside it (HDF5, TFRecord, WebDataset
tar shards, MosaicML MDS, LitData chunks), each sample carrying its id. Each loader runs
one epoch in a fresh process per rank count (``mpiexec -n N`` for N > 1) from cold
caches, used as its users use it (settings in the *settings* column of the report).
Measured per loader: samples/s, mean exposed wait per step, time to the first batch,
peak RSS (process + its workers, summed over ranks), bytes and read calls to storage
(``/proc/PID/io`` ``read_bytes`` and ``syscr`` of the process and its workers; under
``--path`` on an emulator view the emulator's own counters are the better figure), and
what was delivered: distinct classes per global batch (the data is class-sorted: 10 =
every class in every batch), Spearman rank correlation of the delivery order with the
disk order (0 = no trace of it), DeepIO's RL of the delivered order, and the
exactly-once check of the delivered ids. Peers not installed get a row saying so
(``pip install feedline[peers]``); a peer that fails says why.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from feedline.errors import ConfigError
from feedline.units import count_at_least as at_least
from feedline_tools.bench import peer_loaders as pl

DEFAULT_LOADERS = list(pl.LOADERS)
QUICK_LOADERS = [
    "torch-lmdb",
    "torch-lmdb-getitems",
    "torch-h5py",
    "feedline",
    "async-db",
    "feedline-tfrecord",
    "webdataset",
    "mosaic",
    "litdata",
    "tf.data",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--samples",
        "-n",
        type=at_least(1),
        default=None,
        metavar="N",
        help="samples (default 200,000; 4,000 with --quick)",
    )
    parser.add_argument(
        "--batch-size",
        type=at_least(1),
        default=256,
        metavar="B",
        help="global batch (default 256), split evenly over the ranks",
    )
    parser.add_argument(
        "--ranks",
        default=None,
        metavar="LIST",
        help="process counts to run, e.g. 1,2,4 (default 1,2; 1 with --quick)",
    )
    parser.add_argument(
        "--loaders",
        default=None,
        metavar="LIST",
        help=f"loaders (default all; with --quick {','.join(QUICK_LOADERS)}): "
        f"{','.join(pl.LOADERS)}",
    )
    parser.add_argument(
        "--workers",
        type=at_least(0),
        default=2,
        help="DataLoader workers of the streaming peers (default 2)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--path",
        metavar="LMDB",
        help="an existing class-sorted cifar10-large LMDB (e.g. an emulator view "
        "'/tmp/emu/node0'); copies go to --cache",
    )
    parser.add_argument(
        "--cache",
        metavar="DIR",
        help="where the dataset and its copies are kept (default $FEEDLINE_CACHE_DIR/peers/N)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="4,000 samples, 1 process: the CI smoke test"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=1800,
        help="seconds a loader may run before its row says 'timed out'",
    )
    parser.add_argument(
        "--out",
        default="bench-out",
        metavar="DIR",
        help="directory for peers.md and peers.json (default bench-out)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the JSON here")


def _cache_dir(args: argparse.Namespace, n: int) -> str:
    if args.cache:
        return args.cache
    from feedline import defaults

    return os.path.join(defaults.get("cache_dir"), "peers", str(n))


def dataset(args: argparse.Namespace, n: int) -> tuple[str, str]:
    """(LMDB directory, cache directory): the class-sorted LMDB made once."""
    cache = _cache_dir(args, n)
    if args.path:
        os.makedirs(cache, exist_ok=True)
        return args.path, cache
    lmdb_dir = os.path.join(cache, "lmdb")
    if not os.path.exists(os.path.join(lmdb_dir, ".complete")):
        from feedline_tools.generate import run as generate

        os.makedirs(cache, exist_ok=True)
        generate(
            "cifar10-large", lmdb_dir, samples=n, seed=args.seed, force=True, show_progress=False
        )
        with open(os.path.join(lmdb_dir, ".complete"), "w") as f:
            f.write("ok\n")
    return lmdb_dir, cache


def _files_under(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path]
    out = []
    for root, _, names in os.walk(path):
        out += [os.path.join(root, f) for f in names]
    return out


def _launch(cfg: dict[str, Any], ranks: int, timeout: float) -> list[dict[str, Any]]:
    from feedline_tools.bench.harness import mpiexec_command

    with tempfile.TemporaryDirectory(prefix="feedline-peers-") as tmp:
        cfg = dict(cfg, out=tmp, port=20000 + os.getpid() % 20000)
        path = os.path.join(tmp, "config.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        cmd = [sys.executable, "-m", "feedline_tools.bench.peer_run", path]
        if ranks > 1:
            cmd = [mpiexec_command(), "-n", str(ranks), *cmd]
        env = dict(
            os.environ, FEEDLINE_NODES="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONWARNINGS="ignore"
        )
        # a session of its own: on timeout the whole group goes, DataLoader workers too
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return [{"error": f"timed out after {timeout:.0f} s"}]
        finally:
            with contextlib.suppress(ProcessLookupError):  # orphaned workers, if any
                os.killpg(proc.pid, signal.SIGKILL)
        docs = []
        for r in range(ranks):
            p = os.path.join(tmp, f"rank-{r}.json")
            if not os.path.exists(p):
                tail = (err or out or "").strip().splitlines()[-3:]
                return [
                    {
                        "error": f"rank {r} left no result (exit {proc.returncode}): "
                        + " | ".join(tail)[:400]
                    }
                ]
            with open(p) as f:
                d = json.load(f)
            q = os.path.join(tmp, f"ids-{r}.npz")
            if os.path.exists(q):
                with np.load(q) as z:
                    d["_ids"], d["_offs"] = z["ids"], z["offs"]
            docs.append(d)
        return docs


# ------------------------------------------------------------------ measures


def spearman(order: np.ndarray) -> float:
    """Spearman rank correlation of the delivery position with the disk position."""
    if len(order) < 2:
        return float("nan")
    r = np.empty(len(order), dtype=np.float64)
    r[np.argsort(order, kind="stable")] = np.arange(len(order))
    pos = np.arange(len(order), dtype=np.float64)
    return float(np.corrcoef(pos, r)[0, 1])


def delivered(docs: list[dict[str, Any]], n: int, classes: int, batch: int) -> dict[str, Any]:
    """Shuffle quality and the exactly-once check of what the ranks received.

    Global batch s = every rank's step s, in rank order; the global order is those
    batches one after another.
    """
    per_rank = [np.split(d["_ids"], d["_offs"][1:-1]) if len(d["_ids"]) else [] for d in docs]
    steps = max(len(p) for p in per_rank)
    batches = [
        np.concatenate([p[s] for p in per_rank if s < len(p)] or [np.zeros(0, np.int64)])
        for s in range(steps)
    ]
    order = np.concatenate(batches) if batches else np.zeros(0, np.int64)
    uniq = np.unique(order)
    bad = uniq[(uniq < 0) | (uniq >= n)]
    full = [b for b in batches if len(b) >= batch // 2]
    labels = [pl.label_of(b[(b >= 0) & (b < n)], n, classes) for b in full]
    from feedline.plan.rl import rl_of_sequence

    return {
        "delivered": len(order),
        "distinct": len(uniq),
        "duplicates": int(len(order) - len(uniq)),
        "missing": int(n - len(uniq) + len(bad)),
        "foreign": len(bad),
        "exactly_once": bool(len(order) == n and len(uniq) == n and not len(bad)),
        "classes_per_batch": float(np.mean([len(np.unique(lab)) for lab in labels]))
        if labels
        else None,
        "spearman": spearman(order),
        "rl": float(rl_of_sequence(tuple(order.tolist()))) if len(order) > 1 else None,
    }


def measure(
    name: str, ranks: int, lmdb_dir: str, cache: str, args: argparse.Namespace, n: int
) -> dict[str, Any]:
    from feedline_tools.bench.limit import evict

    row: dict[str, Any] = {"loader": name, "ranks": ranks, "what": pl.LOADERS[name][1]}
    missing = pl.missing_package(name)
    if missing:
        row["error"] = f"not installed (pip install feedline[peers]: needs {missing})"
        return row
    cfg = {
        "name": name,
        "lmdb": lmdb_dir,
        "cache": cache,
        "n": n,
        "classes": 10,
        "batch": args.batch_size,
        "seed": args.seed,
        "workers": args.workers,
    }
    prep = _launch(dict(cfg, mode="prepare"), 1, args.timeout)
    if prep[0].get("error"):
        row["error"] = "conversion failed: " + prep[0]["error"]
        return row
    evict(_files_under(prep[0]["path"]))
    t0 = time.perf_counter()
    docs = _launch(dict(cfg, mode="run"), ranks, args.timeout)
    job = time.perf_counter() - t0
    errs = [d["error"] for d in docs if d.get("error")]
    if errs:
        row["error"] = errs[0]
        return row
    wall = max(d["wall_s"] for d in docs)
    row.update(delivered(docs, n, 10, args.batch_size))
    row.update(
        samples_per_s=row["delivered"] / wall if wall > 0 else None,
        wall_s=wall,
        job_s=job,
        ttfb_s=max(d["ttfb_s"] or 0.0 for d in docs),
        wait_ms=1e3 * float(np.mean([d["wait_mean_s"] for d in docs])),
        peak_rss_mb=sum(d["peak_rss_bytes"] for d in docs) / 1e6,
        read_mb=sum(d["read_bytes"] for d in docs) / 1e6,
        read_calls=sum(d["syscr"] for d in docs),
        settings="; ".join(docs[0].get("notes") or []),
    )
    return row


# ------------------------------------------------------------------- report


def _f(x: Any, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and not np.isfinite(x)) else format(x, spec)


def shuffles(r: dict[str, Any], classes: int) -> str:
    """The "shuffles?" cell, judged on what was delivered: ``yes`` when batches mix
    (nearly) every class and the order is unrelated to disk order, ``no`` when the order
    follows the disk, ``partly`` in between."""
    cpb, rho = r.get("classes_per_batch"), r.get("spearman")
    if cpb is None or rho is None or not np.isfinite(cpb) or not np.isfinite(rho):
        return "-"
    if abs(rho) > 0.9 and cpb < 0.5 * classes:
        return "no"
    if cpb >= 0.9 * classes and abs(rho) <= 0.1:
        return "yes"
    return "partly"


def markdown(doc: dict[str, Any]) -> str:
    head = (
        "| loader | P | shuffles? | samples/s | wait/step ms | first batch s | peak RSS MB "
        "| read MB | read calls | classes/batch | Spearman | RL | exactly once |"
    )
    lines = [
        f"`feedline bench peers`: {doc['samples']:,} samples of ~3 KB, class-sorted "
        f"({doc['classes']} classes), global batch {doc['batch_size']}, local disk, cold cache; "
        f"load average {doc['load']}.",
        "",
        "shuffles?: yes = >= 90% of the classes in a batch on average and |Spearman| <= 0.1 "
        "(delivery order unrelated to disk order); no = the order follows the disk; "
        "partly = in between.",
        "",
        head,
        "| " + " | ".join(["---"] * 13) + " |",
    ]
    for r in doc["rows"]:
        if r.get("error"):
            lines.append(f"| {r['loader']} | {r['ranks']} | - | {r['error']} |" + " |" * 9)
            continue
        once = (
            "yes" if r["exactly_once"] else (f"no: {r['duplicates']} dup, {r['missing']} missing")
        )
        lines.append(
            f"| {r['loader']} | {r['ranks']} | {shuffles(r, doc['classes'])} "
            f"| {_f(r['samples_per_s'], ',.0f')} "
            f"| {_f(r['wait_ms'], '.2f')} | {_f(r['ttfb_s'], '.2f')} | {_f(r['peak_rss_mb'], '.0f')} "
            f"| {_f(r['read_mb'], '.0f')} | {r['read_calls']:,} | {_f(r['classes_per_batch'], '.1f')} "
            f"| {_f(r['spearman'], '.3f')} | {_f(r['rl'], '.2f')} | {once} |"
        )
    lines += ["", "Settings of each loader:", ""]
    seen = set()
    for r in doc["rows"]:
        if r["loader"] not in seen and r.get("settings"):
            seen.add(r["loader"])
            lines.append(f"- `{r['loader']}`: {r['settings']}")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    n = args.samples or (4000 if args.quick else 200_000)
    ranks = [int(x) for x in (args.ranks or ("1" if args.quick else "1,2")).split(",") if x]
    names = (
        args.loaders.split(",")
        if args.loaders
        else (QUICK_LOADERS if args.quick else DEFAULT_LOADERS)
    )
    unknown = [x for x in names if x not in pl.LOADERS]
    if unknown:
        raise ConfigError(f"unknown loader(s) {unknown}; known: {list(pl.LOADERS)}")
    if args.batch_size < 1 or any(r < 1 or args.batch_size % r for r in ranks):
        raise ConfigError("--batch-size must be a positive multiple of every rank count")
    lmdb_dir, cache = dataset(args, n)
    rows = []
    for r in ranks:
        for name in names:
            row = measure(name, r, lmdb_dir, cache, args, n)
            rows.append(row)
            msg = row.get("error") or (
                f"{row['samples_per_s']:,.0f} samples/s, {row['classes_per_batch']:.1f} "
                "classes/batch"
            )
            print(f"peers: {name} x{r}: {msg}", flush=True)
    doc = {
        "scenario": "peers",
        "samples": n,
        "classes": 10,
        "batch_size": args.batch_size,
        "ranks": ranks,
        "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "rows": rows,
    }
    os.makedirs(args.out, exist_ok=True)
    text = markdown(doc)
    with open(os.path.join(args.out, "peers.md"), "w") as f:
        f.write(text)
    for p in {os.path.join(args.out, "peers.json"), args.json} - {None}:
        with open(p, "w") as f:
            json.dump(doc, f, indent=1, default=float)
    print(text)
    return 0
