# SPDX-License-Identifier: Apache-2.0
"""``feedline bench overhead``: the Loader's CPU cost per sample when the data is in memory.

One process pinned to one core (every thread of the process, including those it starts
later), the dataset in the page cache (read once, then one untimed epoch per row): the
only cost left is the loader's own work per sample — planning, gathering, copying,
decoding, batching. For each sample size (default 3 KB and 256 KB, an HDF5 file of
``(N, size)`` uint8 rows) it times whole epochs of feedline ``Loader`` presets and of
PyTorch's ``DataLoader`` (map-style dataset over the same file, ``num_workers=0``, default
collation into a tensor, shuffled), interleaved in each repeat so that they share the
machine's state, and reports samples/s, CPU microseconds per sample and the ratio to
the DataLoader. Two map-style datasets are compared: per-sample ``os.pread`` (the
cheapest way to read a row, the fair baseline) and h5py indexing (what most HDF5
training scripts do). The trade-off of one core: it shows per-sample CPU cost, not
what extra threads could hide on a bigger machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import numpy as np

from feedline.errors import ConfigError
from feedline.units import count_at_least as at_least
from feedline_tools.bench import report
from feedline_tools.bench.harness import _size

DEFAULT_SIZES = "3K,256K"
DEFAULT_BYTES = 128 << 20  # per sample size: epochs of ~0.1-1 s
QUICK_BYTES = 2 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sizes", default=DEFAULT_SIZES, metavar="LIST", help="sample sizes (default 3K,256K)"
    )
    parser.add_argument(
        "--bytes",
        type=_size,
        default=None,
        metavar="BYTES",
        help="dataset bytes per sample size (default 128M; 2M with --quick), at least two "
        "batches of samples",
    )
    parser.add_argument(
        "--batch-size", type=at_least(1), default=128, metavar="B", help="default 128"
    )
    parser.add_argument(
        "--presets",
        default="feedline,async-db,tf-pre,tf",
        metavar="LIST",
        help="Loader presets (default feedline,async-db,tf-pre,tf)",
    )
    parser.add_argument(
        "--peers",
        default="torch-pread,torch-h5py",
        metavar="LIST",
        help="DataLoader rows: torch-pread, torch-h5py (default both)",
    )
    parser.add_argument("--core", type=int, default=None, help="CPU to pin to (default: last)")
    parser.add_argument(
        "--repeats", type=at_least(1), default=None, help="epochs timed per row (3)"
    )
    parser.add_argument("--path", metavar="DIR", help="where to write the data (default: temp)")
    parser.add_argument("--ranks", type=int, default=1, metavar="N", help="must be 1 (one core)")
    parser.add_argument("--nodes", type=int, default=1, metavar="M", help="must be 1")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repeat")
    parser.add_argument("--json", metavar="PATH", help="write the result document here")
    parser.add_argument("--out", default="bench-out", metavar="DIR", help="table, JSON, plot")
    report.add_plot_arguments(parser)


# ----------------------------------------------------------------------- pinning


def pin_process(core: int) -> list[int]:
    """Pin every thread of this process to *core* (threads created later inherit it);
    return the previous CPU set."""
    before = sorted(os.sched_getaffinity(0))
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError, PermissionError):  # thread exited
            os.sched_setaffinity(int(tid), {core})
    return before


def unpin_process(cpus: list[int]) -> None:
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.sched_setaffinity(int(tid), set(cpus))


# -------------------------------------------------------------------------- data


def generate(path: str, sample_bytes: int, n: int, seed: int = 0) -> str:
    """An HDF5 file with ``x``: (n, sample_bytes) uint8 (contiguous) and ``y``: (n,)."""
    import h5py

    rng = np.random.default_rng(seed)
    tmp = path + ".tmp"
    with h5py.File(tmp, "w") as f:
        x = f.create_dataset("x", (n, sample_bytes), dtype=np.uint8)
        step = max(1, (8 << 20) // sample_bytes)
        for a in range(0, n, step):
            b = min(n, a + step)
            x[a:b] = rng.integers(0, 256, (b - a, sample_bytes), dtype=np.uint8)
        f.create_dataset("y", data=np.arange(n, dtype=np.int64) % 10)
    os.replace(tmp, path)
    return path


def _warm(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(8 << 20):
            pass


class _PreadRows:
    """Map-style dataset: row i as a numpy array read with one ``os.pread``."""

    def __init__(self, path: str, offset: int, row: int, n: int) -> None:
        self.fd = os.open(path, os.O_RDONLY)
        self.offset, self.row, self.n = offset, row, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        a = np.empty(self.row, dtype=np.uint8)  # writable, so collation needs no copy
        if os.preadv(self.fd, [a.data], self.offset + i * self.row) != self.row:
            raise OSError(f"short read of row {i}")
        return a, i % 10

    def close(self) -> None:
        os.close(self.fd)


class _H5Rows:
    """Map-style dataset: row i with h5py indexing."""

    def __init__(self, path: str) -> None:
        import h5py

        self.f = h5py.File(path, "r")
        self.x = self.f["x"]

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], i % 10

    def close(self) -> None:
        self.f.close()


# ------------------------------------------------------------------------ epochs


def _epoch_loader(loader: Any, epoch: int) -> int:
    n = 0
    loader.set_epoch(epoch)
    for b in loader:
        n += len(b.data)
    return n


def _epoch_torch(dl: Any, gen: Any, epoch: int) -> int:
    gen.manual_seed(epoch)
    n = 0
    for x, _y in dl:
        n += len(x)
    return n


def measure(path: str, batch: int, presets: list[str], peers: list[str], repeats: int):
    """Rows ``{name, samples_per_s, cpu_us_per_sample, times_s}`` for one file."""
    import feedline

    ds = feedline.open_dataset(path, format="hdf5")
    index = ds.index
    n, row = len(index), int(index.lengths[0])
    mapds: dict[str, Any] = {}
    if "torch-pread" in peers:
        mapds["torch-pread"] = _PreadRows(index.files[0], int(index.offsets[0]), row, n)
    if "torch-h5py" in peers:
        mapds["torch-h5py"] = _H5Rows(path)
    import torch
    from torch.utils.data import DataLoader

    from feedline.loader import Loader

    # built once, like a training script does; each timed epoch is set_epoch + iterate
    loaders = {p: Loader(ds, batch, preset=p, decode=True) for p in presets}
    runs: dict[str, Any] = {p: (lambda e, ld=ld: _epoch_loader(ld, e)) for p, ld in loaders.items()}
    for k, m in mapds.items():
        gen = torch.Generator()
        dl = DataLoader(m, batch_size=batch, shuffle=True, num_workers=0, generator=gen)
        runs[k] = lambda e, dl=dl, gen=gen: _epoch_torch(dl, gen, e)
    wall: dict[str, list[float]] = {k: [] for k in runs}
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    errors: dict[str, str] = {}
    try:
        _warm(path)
        for epoch in range(repeats + 1):  # epoch 0: untimed warm-up of every row
            for name, fn in runs.items():
                if name in errors:
                    continue
                c0, t0 = time.process_time(), time.perf_counter()
                try:
                    got = fn(epoch)
                except Exception as e:  # a row fails, the others are still measured
                    errors[name] = f"{type(e).__name__}: {e}"
                    continue
                t, c = time.perf_counter() - t0, time.process_time() - c0
                if got != n:
                    errors[name] = f"delivered {got} samples of {n}"
                elif epoch:
                    wall[name].append(t)
                    cpu[name].append(c)
    finally:
        for ld in loaders.values():
            ld.close()
        for m in mapds.values():
            m.close()
        ds.close()
    rows: list[dict[str, Any]] = []
    for name in runs:
        if name in errors:
            rows.append({"name": name, "error": errors[name]})
            continue
        t = statistics.median(wall[name])
        rows.append(
            {
                "name": name,
                "kind": "loader" if name in presets else "torch",
                "samples_per_s": n / t,
                "MBps": n * row / t / 1e6,
                "cpu_us_per_sample": 1e6 * statistics.median(cpu[name]) / n,
                "times_s": wall[name],
                "error": None,
            }
        )
    base = next((r for r in rows if r["name"] == "torch-pread" and not r["error"]), None)
    base = base or next((r for r in rows if r.get("kind") == "torch" and not r["error"]), None)
    for r in rows:
        r["ratio_to_torch"] = (
            r["samples_per_s"] / base["samples_per_s"] if base and not r["error"] else None
        )
    return {
        "samples": n,
        "sample_bytes": row,
        "baseline": base["name"] if base else None,
        "rows": rows,
    }


def run(args: argparse.Namespace) -> int:
    if args.ranks != 1 or args.nodes != 1:
        raise ConfigError("bench overhead measures one process on one core: --ranks 1 --nodes 1")
    sizes = [_size(s) for s in args.sizes.split(",") if s]
    if not sizes or min(sizes) < 1:
        raise ConfigError(f"--sizes: sample sizes of at least 1 byte, got {args.sizes!r}")
    presets = [p for p in args.presets.split(",") if p]
    peers = [p for p in args.peers.split(",") if p]
    bad = set(peers) - {"torch-pread", "torch-h5py"}
    if bad:
        raise ConfigError(f"--peers: unknown {sorted(bad)}; known: torch-pread, torch-h5py")
    repeats = args.repeats or (1 if args.quick else 3)
    total = args.bytes or (QUICK_BYTES if args.quick else DEFAULT_BYTES)
    cpus = sorted(os.sched_getaffinity(0))
    core = cpus[-1] if args.core is None else args.core
    if core not in cpus:
        raise ConfigError(f"--core {core} is not one of this process's CPUs {cpus}")
    tmp = None
    base = args.path
    if base is None:
        base = tmp = tempfile.mkdtemp(prefix="feedline-overhead-")
    os.makedirs(base, exist_ok=True)
    doc: dict[str, Any] = {
        "scenario": "overhead",
        "core": core,
        "batch_size": args.batch_size,
        "repeats": repeats,
        "sizes": [],
    }
    try:
        for size in sizes:
            n = max(2 * args.batch_size, total // size)
            path = os.path.join(base, f"overhead-{size}.h5")
            if not os.path.exists(path):
                generate(path, size, n)
            before = pin_process(core)
            try:
                doc["sizes"].append(measure(path, args.batch_size, presets, peers, repeats))
            finally:
                unpin_process(before)
            if tmp is not None:
                os.unlink(path)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    emit(doc, args)
    return 1 if any(r["error"] for s in doc["sizes"] for r in s["rows"]) else 0


# ----------------------------------------------------------------------- output


def markdown(doc: dict[str, Any]) -> str:
    out = [
        f"## feedline bench overhead (one core: CPU {doc['core']}, warm page cache, global "
        f"batch {doc['batch_size']}, median of {doc['repeats']} epochs)\n"
    ]
    for s in doc["sizes"]:
        out.append(
            f"### {s['sample_bytes']:,} B samples x {s['samples']:,} "
            f"(ratio to {s['baseline']})\n\n| run | what it is | samples/s | MB/s | "
            "CPU us/sample | vs DataLoader |\n|---|---|---|---|---|---|"
        )
        for r in s["rows"]:
            if r["error"]:
                out.append(
                    f"| {r['name']} | {report.describe_run(r['name'])} | error: {r['error']} ||||"
                )
                continue
            ratio = r["ratio_to_torch"]
            out.append(
                f"| {r['name']} | {report.describe_run(r['name'])} | {r['samples_per_s']:,.0f} | {r['MBps']:.0f} | "
                f"{r['cpu_us_per_sample']:.1f} | {'-' if ratio is None else f'{ratio:.2f}x'} |"
            )
        out.append("")
    return "\n".join(out) + "\n"


def plot(doc: dict[str, Any], path: str) -> str | None:
    plt = report._pyplot()
    sizes = doc["sizes"]
    if not sizes:
        return None
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 3.6), squeeze=False)
    for ax, s in zip(axes[0], sizes, strict=True):
        rows = [r for r in s["rows"] if not r["error"]]
        ax.bar(
            range(len(rows)),
            [r["samples_per_s"] for r in rows],
            color=["C0" if r["kind"] == "loader" else "C1" for r in rows],
        )
        ax.set_xticks(range(len(rows)), [r["name"] for r in rows], rotation=30, ha="right")
        ax.set_ylabel("samples/s (one core)")
        ax.set_title(f"{s['sample_bytes']:,} B samples")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def emit(doc: dict[str, Any], args: argparse.Namespace) -> None:
    report.emit_scenario(
        doc,
        args,
        "overhead",
        markdown(doc),
        lambda: plot(doc, os.path.join(args.out, "overhead.png")),
    )
