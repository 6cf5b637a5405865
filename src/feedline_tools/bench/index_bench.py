# SPDX-License-Identifier: Apache-2.0
"""``feedline bench index``: how long building an LMDB index takes and how much it reads.

Builds the index of a ``cifar10-large``-shaped LMDB (>= 200 K Caffe Datums of ~3 KB,
committed every 1,000) and an ``imagenet``-shaped one (~192 KB Datums), generated with
``feedline make`` or taken from ``--path``, with feedline's native parser (breadth-first
over branch and leaf pages, coalesced ``pread``; overflow data is never read), warm and
cold cache (cold: the file's pages evicted with ``posix_fadvise(DONTNEED)`` first).
Reported per run: wall time, bytes the parser read and that fraction of the file, read
calls, bytes the storage delivered (``/proc/self/io``, includes kernel read-ahead), and
the tree's shape. The ``liblmdb`` peer is what a Caffe-style reader has to do to learn
the same offsets: walk every record with liblmdb's cursor over mmap (it faults in each
overflow run's first page). Every run's digest covers (key, offset, length) of all
records, so equal digests mean identical indexes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

#: name -> (generator, samples, quick samples, generator options)
SHAPES: dict[str, tuple[str, int, int, dict[str, Any]]] = {
    "cifar10-large": ("cifar10-large", 200_000, 3_000, {"commit_every": 1000}),
    "imagenet": ("imagenet", 2_000, 40, {"commit_every": 1000}),
}


@dataclass(frozen=True, slots=True)
class Target:
    """One LMDB to index: a label and its directory."""

    name: str
    path: str


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--path",
        action="append",
        default=[],
        metavar="LMDB",
        help="index this LMDB (directory or data.mdb) instead of generated ones; repeatable",
    )
    parser.add_argument(
        "--shapes",
        default=",".join(SHAPES),
        metavar="LIST",
        help=f"generated datasets (default {','.join(SHAPES)})",
    )
    parser.add_argument(
        "--cifar-samples",
        type=int,
        default=None,
        metavar="N",
        help="records of cifar10-large (default 200000; 3000 with --quick)",
    )
    parser.add_argument(
        "--imagenet-samples",
        type=int,
        default=None,
        metavar="N",
        help="records of imagenet (default 2000; 40 with --quick)",
    )
    parser.add_argument(
        "--workdir",
        default=None,
        metavar="DIR",
        help="where to generate (default: a temporary directory, removed)",
    )
    parser.add_argument("--keep", action="store_true", help="keep generated datasets")
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        metavar="R",
        help="repetitions per cache state; the median is reported (default 3)",
    )
    parser.add_argument("--no-liblmdb", action="store_true", help="skip the liblmdb cursor peer")
    parser.add_argument("--json", default=None, metavar="PATH", help="write the results as JSON")
    parser.add_argument("--quick", action="store_true", help="tiny datasets, one repetition")


# ----------------------------------------------------------------------------- probes


def _storage_read_bytes() -> int | None:
    """Bytes this process caused to be read from storage (Linux /proc/self/io)."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def evict(path: str) -> None:
    """Drop *path*'s clean pages from the page cache (no process may have it mapped)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _digest(keys: list[bytes], offsets: np.ndarray, lengths: np.ndarray) -> str:
    h = hashlib.sha256()
    for k, o, n in zip(keys, offsets.tolist(), lengths.tolist(), strict=True):
        o = o if n else 0  # an empty value has no meaningful address
        h.update(
            len(k).to_bytes(4, "little") + k + o.to_bytes(8, "little") + n.to_bytes(8, "little")
        )
    return h.hexdigest()


def _feedline(data: str) -> dict[str, Any]:
    from feedline.formats.lmdb import index_lmdb

    io0 = _storage_read_bytes()
    t0 = time.perf_counter()
    idx = index_lmdb(data)
    dt = time.perf_counter() - t0
    io1 = _storage_read_bytes()
    m = idx.meta
    if idx.keys is None:  # pragma: no cover - an LMDB index always has its keys
        raise AssertionError(f"{data}: the LMDB index has no keys")
    return {
        "time_s": dt,
        "bytes_read": int(m["bytes_read"]),
        "read_ops": int(m["read_ops"]),
        "storage_bytes": None if io0 is None or io1 is None else io1 - io0,
        "records": len(idx),
        "digest": _digest(list(idx.keys), idx.offsets, idx.lengths),
        "layout": {k: m[k] for k in ("page_size", "depth", "branch_pages", "leaf_pages",
                                     "overflow_pages", "payload_fraction", "txnid")},
    }  # fmt: skip


def _liblmdb(data: str) -> dict[str, Any]:
    """Offsets as a liblmdb cursor walk finds them (value address minus the map's base)."""
    import lmdb

    io0 = _storage_read_bytes()
    t0 = time.perf_counter()
    env = lmdb.open(data, readonly=True, lock=False, subdir=False)
    keys, addrs, lengths = [], [], []
    with env.begin(buffers=True) as txn:
        for k, v in txn.cursor():
            keys.append(bytes(k))
            addrs.append(_address(v))
            lengths.append(len(v))
    dt = time.perf_counter() - t0
    io1 = _storage_read_bytes()
    base = _map_base(env, data)  # untimed: only to compare indexes
    env.close()
    off = np.asarray(addrs, dtype=np.int64) - (base or 0)
    return {
        "time_s": dt,
        "bytes_read": None,
        "read_ops": None,
        "storage_bytes": None if io0 is None or io1 is None else io1 - io0,
        "records": len(keys),
        "digest": None if base is None else _digest(keys, off, np.asarray(lengths, dtype=np.int64)),
        "layout": {},
    }


def _address(buf: Any) -> int:
    mv = memoryview(buf)
    return np.frombuffer(mv, dtype=np.uint8).__array_interface__["data"][0] if len(mv) else 0


def _map_base(env: Any, data: str) -> int | None:
    """Where liblmdb mapped the file: record 0's address minus its offset in the file
    (py-lmdb does not expose the map address)."""
    from feedline.formats.lmdb import LmdbFile

    f = LmdbFile(data)
    try:
        if len(f) == 0:
            return None
        first = f.seek(0)
    finally:
        f.close()
    with env.begin(buffers=True) as txn:
        cur = txn.cursor()
        if not cur.first() or not len(cur.value()):
            return None
        return _address(cur.value()) - first.value_offset


# ------------------------------------------------------------------------------- run


def _targets(args: argparse.Namespace, workdir: str) -> list[Target]:
    from feedline.formats.lmdb import data_file

    if args.path:
        return [Target(os.path.basename(os.path.dirname(data_file(p))) or p, p) for p in args.path]
    from feedline_tools.make import generate

    out = []
    for name in [s for s in args.shapes.split(",") if s]:
        if name not in SHAPES:
            raise SystemExit(f"unknown shape {name!r}; known: {sorted(SHAPES)}")
        gen, n, nq, opts = SHAPES[name]
        override = args.cifar_samples if name == "cifar10-large" else args.imagenet_samples
        samples = override or (nq if args.quick else n)
        path = os.path.join(workdir, f"{name}-{samples}")
        if not os.path.exists(os.path.join(path, "data.mdb")):
            print(f"generating {name} ({samples} records) in {path} ...", file=sys.stderr)
            generate(gen, path, samples=samples, seed=0, force=True, progress=False, **opts)
        out.append(Target(name, path))
    return out


def _median_run(fn, data: str, cold: bool, repeat: int) -> dict[str, Any]:
    results = []
    for _ in range(repeat):
        if cold:
            evict(data)
        results.append(fn(data))
    results.sort(key=lambda r: r["time_s"])
    best = dict(results[len(results) // 2])
    best["times_s"] = [r["time_s"] for r in results]
    return best


def run(args: argparse.Namespace) -> int:
    from feedline.formats.lmdb import data_file

    repeat = 1 if args.quick else max(1, args.repeat)
    own = args.workdir is None
    workdir = args.workdir or tempfile.mkdtemp(prefix="feedline-index-bench-")
    os.makedirs(workdir, exist_ok=True)
    runs: list[dict[str, Any]] = []
    try:
        for tgt in _targets(args, workdir):
            data = data_file(tgt.path)
            size = os.path.getsize(data)
            peers = [("feedline", _feedline)] + ([] if args.no_liblmdb else [("liblmdb", _liblmdb)])
            for cache in ("cold", "warm"):
                for peer, fn in peers:
                    if cache == "warm":
                        fn(data)  # make sure everything it touches is cached
                    r = _median_run(fn, data, cache == "cold", repeat)
                    r.update(
                        name=f"{peer}:{tgt.name}:{cache}",
                        peer=peer,
                        dataset=tgt.name,
                        path=data,
                        cache=cache,
                        file_bytes=size,
                        ranks=1,
                        nodes=1,
                        read_fraction=None if r["bytes_read"] is None else r["bytes_read"] / size,
                        storage_fraction=None
                        if r["storage_bytes"] is None
                        else r["storage_bytes"] / size,
                        records_per_s=r["records"] / r["time_s"] if r["time_s"] > 0 else None,
                    )
                    runs.append(r)
    finally:
        if own and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    for r in runs:
        base = next(b for b in runs if b["dataset"] == r["dataset"] and b["cache"] == r["cache"])
        r["ratio_to_baseline"] = r["time_s"] / base["time_s"] if base["time_s"] > 0 else None
        r["matches_feedline"] = r["digest"] == base["digest"] if r["digest"] else None
    doc = {"scenario": "index", "limit_MBps": None, "baseline": "feedline", "repeat": repeat,
           "runs": runs}  # fmt: skip
    print(markdown_table(doc))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    bad = [r["name"] for r in runs if r["matches_feedline"] is False]
    if bad:
        print(f"index mismatch against feedline: {bad}", file=sys.stderr)
        return 1
    return 0


def _mb(x: int | None) -> str:
    return "-" if x is None else f"{x / 1e6:.2f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def markdown_table(doc: dict[str, Any]) -> str:
    """The runs as a Markdown table."""
    head = ("| run | records | file MB | time s | read MB | read % | preads | storage MB | "
            "storage % | depth | leaf pages | same index |")  # fmt: skip
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in doc["runs"]:
        lay = r.get("layout") or {}
        lines.append(
            f"| {r['name']} | {r['records']} | {_mb(r['file_bytes'])} | {r['time_s']:.4f} | "
            f"{_mb(r['bytes_read'])} | {_pct(r['read_fraction'])} | {r['read_ops'] or '-'} | "
            f"{_mb(r['storage_bytes'])} | {_pct(r['storage_fraction'])} | {lay.get('depth', '-')} | "
            f"{lay.get('leaf_pages', '-')} | {'-' if r['matches_feedline'] is None else r['matches_feedline']} |"
        )
    return "\n".join(lines)
