# SPDX-License-Identifier: Apache-2.0
"""``feedline bench readers``: explicit reads vs mmap vs per-sample reads, by block size.

Reproduces LMDBIO Fig. 8 on this machine's storage: the same fixed-length records read
(1) with large sequential ``pread`` s of a given block size (the ``seq`` peer), (2) from
a memory mapping copied out in pieces of that block size (``mmap``), and (3) one
``pread`` per sample. Explicit reads should scale with the block size and mmap should
not, because the kernel never learns the copy size; per-sample reads pay one request per
record. All runs deliver the same samples, so their digests must be equal.

Without ``--path`` a file of ``--size`` random bytes is generated in a temporary
directory (removed afterwards); with ``--path`` the file is used, or generated there if
missing (once per emulated node when the path contains ``{node}``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

import numpy as np

from feedline import defaults
from feedline.units import count_at_least as at_least
from feedline_tools.bench.harness import (
    RunSpec,
    _size,
    add_common_arguments,
    exit_code,
    run_scenario,
    size_label,
)
from feedline_tools.bench.runners import DatasetSpec

DEFAULT_BLOCKS = "4K,16K,64K,256K,1M,8M"
QUICK_BLOCKS = "4K,64K"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--size",
        type=_size,
        default=256 << 20,
        metavar="BYTES",
        help="bytes of the generated file (default 256M; 4M with --quick)",
    )
    parser.add_argument(
        "--record-bytes",
        type=_size,
        default=3072,
        metavar="BYTES",
        help="record length (default 3072, CIFAR10-Large-like)",
    )
    parser.add_argument(
        "--batch-size",
        type=at_least(1),
        default=1024,
        metavar="B",
        help="global batch in records (default 1024)",
    )
    parser.add_argument(
        "--blocks",
        default=None,
        metavar="LIST",
        help=f"block sizes (default {DEFAULT_BLOCKS}; {QUICK_BLOCKS} with --quick)",
    )
    parser.add_argument(
        "--presets",
        default="",
        metavar="LIST",
        help="feedline Loader presets to add as rows, e.g. 'contiguous,feedline' "
        "(they must deliver the same digest as the peers when their order is contiguous)",
    )
    add_common_arguments(parser)


def generate(path: str, size: int, record_bytes: int, seed: int = 0) -> str:
    """Write ``size // record_bytes`` random records to *path* (atomically); return it."""
    n = max(1, size // record_bytes)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    rng = np.random.default_rng(seed)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        left = n * record_bytes
        while left:
            chunk = min(left, 8 << 20)
            f.write(rng.integers(0, 256, chunk, dtype=np.uint8).tobytes())
            left -= chunk
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def runs_for(blocks: list[int]) -> list[RunSpec]:
    """The compared configurations: pread and mmap per block size, and per-sample pread."""
    runs = []
    for bs in blocks:
        lab = size_label(bs)
        runs.append(
            RunSpec(f"mmap-{lab}", "mmap", {"block": bs}, {"method": "mmap", "block_bytes": bs})
        )
        runs.append(
            RunSpec(f"pread-{lab}", "seq", {"block": bs}, {"method": "pread", "block_bytes": bs})
        )
    runs.append(RunSpec("per-sample", "pread", {}, {"method": "per-sample pread"}))
    return runs


def run(args: argparse.Namespace) -> int:
    size = (4 << 20) if args.quick and args.size == 256 << 20 else args.size
    blocks = [
        _size(b)
        for b in (args.blocks or (QUICK_BLOCKS if args.quick else DEFAULT_BLOCKS)).split(",")
    ]
    runs = runs_for(blocks)
    runs += [RunSpec(f"loader:{p}", f"loader:{p}") for p in args.presets.split(",") if p]
    if args.baseline is None:
        args.baseline = runs[0].name
    nodes = args.nodes or int(defaults.get("nodes") or 1)
    tmpdir: list[str] = []

    def dataset() -> DatasetSpec:
        path = args.path
        if path is None:
            tmpdir.append(tempfile.mkdtemp(prefix="feedline-readers-"))
            path = os.path.join(tmpdir[0], "records.bin")
        for node in range(nodes if "{node}" in path else 1):
            p = path.replace("{node}", str(node))
            if not os.path.exists(p):
                generate(p, size, args.record_bytes)
        return DatasetSpec(path, "records", {"record_bytes": args.record_bytes})

    try:
        doc = run_scenario("readers", runs, dataset, args, batch_size=args.batch_size)
    finally:
        for d in tmpdir:
            shutil.rmtree(d, ignore_errors=True)
    return exit_code(doc)
