# SPDX-License-Identifier: Apache-2.0
"""``feedline probe PATH``: measure the storage profile the planner's cost model needs.

In a bounded time (default 20 s, at most what ``--seconds`` allows) the probe measures,
on a file of the dataset (the largest one under PATH) or on a scratch file it writes and
removes: the per-request latency (cold random 4 KiB direct reads, median), single-stream
bandwidth for reads of 4 KiB to 16 MiB, and the aggregate bandwidth of 1 to 16 concurrent
streams (the native engine's threads, 4 MiB reads, cold). The result is a
:class:`~feedline.plan.cost.StorageProfile`, saved per file system (mount point and type)
under the cache directory, where :func:`feedline.plan.cost.get_profile` finds it for
every dataset on that file system. A storage emulator mount (``feedline emulate``)
reports its own profile from its parameters, without measuring.

Whether ranks share the page cache cannot be measured from one process: the ranks of one
node share it and nodes do not (``shared_cache="node"``); the emulator's node views each
have their own (``"view"``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

from .. import defaults
from ..errors import ConfigError
from .profiles import (
    emulator_profile,
    load_saved_profile,
    mount_of,
    save_profile,
)

_KiB, _MiB = 1 << 10, 1 << 20
#: block sizes of the single-stream sweep
BLOCKS = (4 * _KiB, 64 * _KiB, 1 * _MiB, 4 * _MiB, 16 * _MiB)
#: concurrent streams of the aggregate sweep
STREAMS = (1, 2, 4, 8, 16)
#: the scratch file written when PATH holds no file large enough
SCRATCH_BYTES = 256 * _MiB
#: files smaller than this are not probed (the device's cache would answer)
MIN_FILE = 64 * _MiB
#: a single-stream measurement reads at most this fraction of the file (1/STREAM_SHARE),
#: so that the five of them leave most of it unread for the aggregate sweep
STREAM_SHARE = 16
#: reads of its block a single-stream measurement makes at least
MIN_READS = 8


class _Fresh:
    """Regions of the probed file that this probe has not read yet, one per measurement.

    A virtual disk's host can keep the blocks it served recently: on this project's
    2-core VM a region read again came at 1.5-1.6 GB/s where its first read came at
    0.66-0.73 GB/s (docs/planner.md, "Storage profiles"). A probe that re-read one
    region measured that cache, and the model priced a first epoch, which reads data
    nothing has read lately, 2-3x too fast. When the file is used up, the next region
    starts again from its beginning; the bytes read twice are reported (``reread``)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.at = 0
        self.reread = 0
        self._high = 0  # the end of what was read

    def take(self, nbytes: int) -> int:
        """The offset of the next *nbytes* (4 MiB aligned) nobody read in this probe."""
        nbytes = min(int(nbytes), self.size)
        if self.at + nbytes > self.size:
            self.at = 0
        if self.at < self._high:  # only what was read before counts
            self.reread += min(nbytes, self._high - self.at)
        off = self.at
        self.at += -(-nbytes // (4 * _MiB)) * (4 * _MiB)
        self._high = max(self._high, min(self.at, self.size))
        return off


# --------------------------------------------------------------- measuring


def _target(path: str) -> tuple[str, bool]:
    """(file to read, whether it is a scratch file the probe wrote)."""
    if os.path.isfile(path):
        if os.path.getsize(path) < MIN_FILE:
            path = os.path.dirname(os.path.abspath(path))
        else:
            return path, False
    if not os.path.isdir(path):
        raise ConfigError(f"feedline probe: no such file or directory: {path}")
    best, size = None, 0
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(".")][:64]
        for name in files[:4096]:
            p = os.path.join(root, name)
            try:
                s = os.path.getsize(p)
            except OSError:
                continue
            if s > size and os.access(p, os.R_OK):
                best, size = p, s
    if best is not None and size >= MIN_FILE:
        return best, False
    if not os.access(path, os.W_OK):
        raise ConfigError(
            f"feedline probe: {path} holds no file of at least {MIN_FILE >> 20} MiB and is not "
            "writable for a scratch file: probe a directory with a large dataset file"
        )
    fd, tmp = tempfile.mkstemp(dir=path, prefix=".feedline-probe-")
    chunk = np.random.default_rng(0).integers(0, 256, 4 * _MiB, dtype=np.uint8).tobytes()
    with os.fdopen(fd, "wb") as f:
        for _ in range(SCRATCH_BYTES // len(chunk)):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    return tmp, True


def _latency(path: str, size: int, reads: int, deadline: float) -> float:
    from .engine import IOEngine, aligned_empty, evict

    evict(path)
    rng = np.random.default_rng(1)
    buf = aligned_empty(4 * _KiB)
    offs = rng.integers(0, max(1, size // (4 * _KiB)), reads) * (4 * _KiB)
    times = []
    with IOEngine([path], threads=1, method="odirect", chunk_bytes=4 * _KiB) as eng:
        for o in offs:
            t0 = time.perf_counter()
            eng.read((np.zeros(1, np.int32), np.array([o]), np.array([4 * _KiB])), buf)
            times.append(time.perf_counter() - t0)
            if time.perf_counter() > deadline:
                break
    return float(statistics.median(times))


def measure(path: str, seconds: float = 20.0, progress: bool = True) -> dict[str, Any]:
    """Measure *path*'s storage (see the module docstring); returns the profile as a dict
    with the raw measurements under ``"measured"``."""
    from ..plan.cost import FS_PROFILES, PROFILES, fs_type
    from .engine import bench_read

    emu = emulator_profile(path)
    if emu is not None:
        return emu
    t_start = time.perf_counter()
    deadline = t_start + seconds
    target, scratch = _target(path)

    def say(msg: str) -> None:
        if progress:
            print(f"probe: {msg}", file=sys.stderr, flush=True)

    try:
        size = os.path.getsize(target)
        say(f"reading {target} ({size / 1e6:.0f} MB{', scratch' if scratch else ''})")
        lat = _latency(target, size, 64, t_start + 0.15 * seconds)
        say(f"latency {lat * 1e3:.3f} ms (cold 4 KiB direct reads, median)")
        stream: dict[str, float] = {}
        budget = 0.45 * seconds / len(BLOCKS)
        fresh = _Fresh(size)
        for b in BLOCKS:
            # as many bytes as this block size reads in its share of the time, roughly
            est_bw = b / (lat + b / 2e9)
            # at least MIN_READS reads of the block, fresh or not (a point of 1-2 reads
            # is noise), else its share of the file
            share = max(MIN_READS * b, size // STREAM_SHARE)
            cap = int(min(max(b, est_bw * budget), 512 * _MiB, share, size))
            r = bench_read(target, b, "odirect", max_bytes=cap, offset=fresh.take(cap))
            stream[str(b)] = r.bytes / max(r.seconds, 1e-9)
            say(f"one stream, {b >> 10} KiB reads: {stream[str(b)] / 1e6:.0f} MB/s")
            if time.perf_counter() > deadline:
                break
        agg: dict[str, float] = {}
        for k in STREAMS:
            if time.perf_counter() > deadline:
                break
            # the sweep shares what the single streams left of the file, two rounds of
            # reads at least (a small file is re-read from its start: fresh.reread)
            left = (size - fresh.at) // (len(STREAMS) - STREAMS.index(k))
            cap = int(min(512 * _MiB, max(left, 2 * k * 4 * _MiB), size))
            r = bench_read(
                target, 4 * _MiB, "odirect", threads=k, max_bytes=cap, offset=fresh.take(cap)
            )
            agg[str(k)] = r.bytes / max(r.seconds, 1e-9)
            say(f"{k} streams, 4 MiB reads: {agg[str(k)] / 1e6:.0f} MB/s")
    finally:
        if scratch:
            os.unlink(target)
    fs = fs_type(os.path.dirname(os.path.abspath(target)))
    kind = FS_PROFILES.get(fs, "parallel")
    one = max(stream.values(), default=PROFILES[kind].stream_bw)
    best_agg = max(agg.values(), default=one)
    # streams a node keeps busy: the fewest that reach 90% of the best aggregate
    spn = next((int(k) for k, v in agg.items() if v >= 0.9 * best_agg), 1)
    base = PROFILES[kind]
    return {
        "name": "probed",
        "latency_s": lat,
        "stream_bw": one,
        "node_bw": best_agg,
        # one node cannot see the job's aggregate: local storage scales with the nodes,
        # a shared file system keeps its documented default
        "aggregate_bw": base.aggregate_bw,
        "streams_per_node": spn,
        "server_streams": base.server_streams,
        "shared_cache": "node",
        "fs_type": fs,
        "source": f"feedline probe of {target} ({time.strftime('%Y-%m-%d %H:%M')})",
        "notes": "aggregate_bw and server_streams are the documented defaults for this "
        "file system type (one node cannot measure them)",
        "measured": {
            "latency_s": lat,
            "stream_bw_by_block": stream,
            "aggregate_bw_by_streams": agg,
            "reread_bytes": fresh.reread,
            "seconds": time.perf_counter() - t_start,
        },
    }


# --------------------------------------------------------------- command line


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "probe",
        help="measure the storage profile of a file system for the planner",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("path", metavar="PATH", help="a dataset file or directory on the storage")
    p.add_argument("--seconds", type=float, default=20.0, help="time budget (default 20)")
    p.add_argument(
        "--json", metavar="FILE", help="also write the profile to FILE ('-': stdout, alone)"
    )
    p.add_argument(
        "--no-save", action="store_true", help="do not save it for the file system (cache dir)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..plan.cost import StorageProfile

    if not 1 <= args.seconds <= 600:
        raise ConfigError("--seconds must be between 1 and 600")
    doc = measure(args.path, args.seconds, progress=bool(defaults.get("progress")))
    prof = StorageProfile.from_dict(doc)  # checks the fields
    # with --json - the JSON alone goes to stdout (for a pipe), the messages to stderr
    say = sys.stderr if args.json == "-" else sys.stdout
    print(
        f"{prof.name} profile of {args.path} ({prof.fs_type or 'unknown fs'}): latency "
        f"{prof.latency_s * 1e3:.3f} ms, one stream {prof.stream_bw / 1e6:.0f} MB/s, node "
        f"{prof.node_bw / 1e6:.0f} MB/s with {prof.streams_per_node} streams, page cache "
        f"shared per {prof.shared_cache}",
        file=say,
    )
    if args.json == "-":
        json.dump(doc, sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    if not args.no_save and doc.get("name") != "emulator":
        print(f"saved for this file system: {save_profile(args.path, doc)}", file=say)
    return 0


__all__ = ["emulator_profile", "load_saved_profile", "measure", "mount_of", "save_profile"]
