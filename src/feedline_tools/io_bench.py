# SPDX-License-Identifier: Apache-2.0
"""The physical limit, three ways: ``bench_read`` against ``dd iflag=direct`` and fio.

``python -m feedline_tools.io_bench FILE [--blocks 1M 8M] [--repeats 5] [--threads 1 2]``
times cold sequential direct reads of FILE with the engine, ``dd`` and
``fio --direct=1 --ioengine=psync``, interleaved per repeat so that load from other jobs
falls evenly on every reader, and prints the median, min and max of each in MB/s.
Readers whose tool is missing are left out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
from collections.abc import Callable

from feedline.io.engine import bench_read, evict

_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``"8M"`` -> 8388608 (K, M, G are powers of two)."""
    m = re.fullmatch(r"(\d+)([KMG]?)i?B?", text.strip(), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}")
    return int(m.group(1)) * _UNITS.get(m.group(2).upper(), 1)


def _dd(path: str, block: int) -> float:
    evict(path)
    out = subprocess.run(
        ["dd", f"if={path}", "of=/dev/null", "iflag=direct", f"bs={block}"],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    m = re.search(r"^(\d+) bytes.*copied, ([\d.]+) s", out, re.MULTILINE)
    if not m:
        raise RuntimeError(f"cannot parse dd output: {out!r}")
    return int(m.group(1)) / float(m.group(2)) / 1e6


def _fio(path: str, block: int) -> float:
    evict(path)
    out = subprocess.run(
        [
            "fio",
            "--name=limit",
            f"--filename={path}",
            "--rw=read",
            "--direct=1",
            "--ioengine=psync",
            f"--bs={block}",
            "--numjobs=1",
            "--readonly",
            "--output-format=json",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(json.loads(out)["jobs"][0]["read"]["bw_bytes"]) / 1e6


def compare(
    path: str, blocks: list[int], repeats: int, threads: list[int]
) -> dict[str, list[float]]:
    """MB/s of every reader for every block size, *repeats* interleaved samples each."""

    def engine(t: int) -> Callable[[int], float]:
        return lambda b: bench_read(path, b, "odirect", threads=t).MBps

    readers = [(f"feedline odirect, {t} thread(s)", engine(t)) for t in threads]
    if shutil.which("dd"):
        readers.append(("dd iflag=direct", lambda b: _dd(path, b)))
    if shutil.which("fio"):
        readers.append(("fio psync direct", lambda b: _fio(path, b)))
    out: dict[str, list[float]] = {}
    for _ in range(repeats):
        for block in blocks:
            for name, run in readers:
                out.setdefault(f"{name} @ {block >> 10} KiB", []).append(run(block))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m feedline_tools.io_bench", description=__doc__.split("\n")[0]
    )
    ap.add_argument("file")
    ap.add_argument("--blocks", nargs="+", type=parse_size, default=[1 << 20, 8 << 20])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", nargs="+", type=int, default=[1])
    args = ap.parse_args(argv)
    res = compare(os.fspath(args.file), args.blocks, args.repeats, args.threads)
    for name, v in res.items():
        print(
            f"{name:44s} median {statistics.median(v):7.0f} MB/s  [{min(v):.0f}-{max(v):.0f}]  n={len(v)}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
