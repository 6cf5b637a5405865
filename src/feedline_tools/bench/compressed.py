# SPDX-License-Identifier: Apache-2.0
"""Compressed science data: feedline vs h5py reading one gzip+shuffle chunked HDF5 file.

The file is the issue's shape — N samples of side x side x 4 float32 (128x128x4 by
default, 2,000 samples, chunks of 16 samples), gzip level 4 + byte shuffle, with
simulation-like values that compress — and every run delivers the same bytes:

- ``feedline`` / ``async``: the Loader presets (whole compressed chunks read with the
  engine's coalesced preads; each batch's distinct chunks unpacked once, natively, with
  the GIL released);
- ``h5py-slices``: h5py reading each rank's batch as contiguous slices ``x[a:b]`` (the
  best case for h5py: one chunk decompressed per slice, no per-sample calls), with
  h5py's default chunk cache;
- ``torch-h5py``: PyTorch's ``DataLoader`` over a map-style dataset reading one row at a
  time with h5py (the common pattern; each row decompresses its whole chunk unless it is
  still in h5py's 1 MiB chunk cache).

Throughput counts delivered (decompressed) bytes; ratios refer to ``h5py-slices``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from typing import Any

import numpy as np

from feedline.errors import ConfigError
from feedline.units import count_at_least as at_least
from feedline_tools.bench.harness import (
    RunSpec,
    add_common_arguments,
    exit_code,
    is_root,
    run_scenario,
)
from feedline_tools.bench.runners import DatasetSpec, RunOutcome, _PeerBase, register_runner

RUNS = ("feedline", "async", "h5py-slices", "torch-h5py")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("compressed")
    g.add_argument(
        "--samples", type=at_least(1), default=None, help="samples (default 2000; quick 128)"
    )
    g.add_argument(
        "--side", type=at_least(1), default=None, help="sample side (default 128; quick 32)"
    )
    g.add_argument(
        "--chunk", type=at_least(1), default=16, help="samples per HDF5 chunk (default 16)"
    )
    g.add_argument("--batch-size", type=at_least(1), default=None, help="global batch (default 64)")
    g.add_argument("--runs", default=",".join(RUNS), help=f"runs to compare (of {','.join(RUNS)})")
    g.add_argument("--keep-data", action="store_true", help="keep the generated file")
    add_common_arguments(p)


def write_science_h5(path: str, n: int, side: int, chunk: int, seed: int = 0) -> None:
    """N x side x side x 4 float32 with few distinct values (compresses ~3-4x), gzip+shuffle."""
    import h5py

    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        x = f.create_dataset("x", shape=(n, side, side, 4), dtype="<f4",
                             chunks=(chunk, side, side, 4), compression="gzip",
                             compression_opts=4, shuffle=True)  # fmt: skip
        step = max(chunk, (64 << 20) // (side * side * 16) // chunk * chunk)
        for a in range(0, n, step):
            b = min(n, a + step)
            x[a:b] = (rng.integers(0, 64, size=(b - a, side, side, 4)) / 8.0).astype("<f4")
        f.create_dataset("y", data=np.arange(n, dtype=np.int64) % 10)


@register_runner("h5py-slices")
class H5SliceRunner(_PeerBase):
    """h5py reading each step's ids as runs of consecutive rows, one slice per run."""

    def run(self, ctx, rec) -> RunOutcome:
        import h5py

        index = self._index
        name = (index.meta or {}).get("dataset")
        if not name:
            raise ConfigError("h5py-slices reads HDF5 datasets only")
        first = np.searchsorted(index.file_ids, np.arange(len(index.files)))
        out = RunOutcome()
        files = [h5py.File(f, "r") for f in index.files]
        try:
            dsets = [f[name] for f in files]
            for step, ids in enumerate(self._steps):
                t0 = time.perf_counter()
                order = np.sort(ids)
                cuts = np.flatnonzero(np.diff(order) != 1) + 1
                parts = []
                for run in np.split(order, cuts):
                    fid = int(index.file_ids[run[0]])
                    a = int(run[0] - first[fid])
                    parts.append(dsets[fid][a : a + len(run)])
                rows = np.concatenate(parts)
                pos = np.searchsorted(order, ids)
                raw = np.ascontiguousarray(rows[pos]).reshape(len(ids), -1).view(np.uint8)
                out.exposed_io_s += time.perf_counter() - t0
                out.storage_ops += len(cuts) + 1
                out.storage_bytes += raw.nbytes
                lens = np.full(len(ids), raw.shape[1], dtype=np.int64)
                rec.add(step, ids, lens, raw.reshape(-1))
                ctx.compute()
        finally:
            for f in files:
                f.close()
        out.io_s = out.exposed_io_s
        return out


def _dataset(args: argparse.Namespace, n: int, side: int, tmp: list[str]):
    def make() -> DatasetSpec:
        path = args.path
        if path is None:
            tmp.append(tempfile.mkdtemp(prefix="feedline-compressed-"))
            path = os.path.join(tmp[0], "science-gzip-shuffle.h5")
        if not os.path.exists(path.replace("{node}", "0")):
            if "{node}" in path:
                raise ConfigError(f"--path {path!r}: no file at node 0's view")
            write_science_h5(path, n, side, args.chunk)
        return DatasetSpec(path, "hdf5", {"dataset": "x", "labels": "y"})

    return make


def summary(doc: dict[str, Any]) -> str:
    """One line per run: delivered MB/s and the ratio to h5py-slices."""
    runs = {r["name"]: r for r in doc["runs"]}
    base = runs.get("h5py-slices")
    ranks = doc["runs"][0].get("ranks", "?") if doc["runs"] else "?"
    lines = [f"\ncompressed HDF5 (gzip+shuffle), {ranks} rank(s):"]
    for name, r in runs.items():
        mbps = r.get("MBps")
        if not mbps:
            lines.append(f"  {name:12s} failed: {r.get('error')}")
            continue
        ratio = f"{mbps / base['MBps']:.2f}x h5py-slices" if base and base.get("MBps") else ""
        lines.append(f"  {name:12s} {mbps:8.0f} MB/s delivered  {ratio}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    n = args.samples or (128 if args.quick else 2000)
    side = args.side or (32 if args.quick else 128)
    batch = args.batch_size or 64
    names = [r for r in args.runs.split(",") if r]
    unknown = sorted(set(names) - set(RUNS))
    if unknown:
        raise ConfigError(f"--runs: unknown {unknown}; known: {list(RUNS)}")
    specs = {
        "feedline": RunSpec("feedline", "loader:feedline", {}, {"reads": "feedline engine"}),
        "async": RunSpec("async", "loader:async", {}, {"reads": "feedline engine"}, "async"),
        "h5py-slices": RunSpec("h5py-slices", "h5py-slices", {}, {"reads": "h5py slices"}),
        "torch-h5py": RunSpec(
            "torch-h5py", "torch-h5py", {"workers": 0}, {"reads": "h5py per row"}
        ),
    }
    runs = [specs[r] for r in names]
    if args.baseline is None and "h5py-slices" in names:
        args.baseline = "h5py-slices"
    tmp: list[str] = []
    try:
        doc = run_scenario(
            "compressed",
            runs,
            _dataset(args, n, side, tmp),
            args,
            batch_size=batch,
            runner_modules=("feedline_tools.bench.compressed", "feedline_tools.bench.async_bench"),
        )
    finally:
        if not args.keep_data:
            for d in tmp:
                shutil.rmtree(d, ignore_errors=True)
    if doc is not None and is_root():
        print(summary(doc))
    return exit_code(doc)
