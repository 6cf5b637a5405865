# SPDX-License-Identifier: Apache-2.0
"""Measure the emulator's own overhead on this machine.

One synchronous reader does sequential ``O_DIRECT`` reads of a file in the host cache
through a fresh emulator: every request waits for the previous one, so nothing hides
the emulator's costs. Reported: the daemon's overhead per request (service time beyond
the modelled cost), the reader's per request (interval between its requests beyond the
modelled cost; medians, so that another job preempting the reader now and then does
not count as emulator overhead) and over the whole read (wall time beyond the sum).
"""

from __future__ import annotations

import itertools
import mmap
import os
import statistics
import tempfile
import time
from dataclasses import dataclass

from feedline_tools.emulate.mount import Emulator
from feedline_tools.emulate.params import EmulatorParams


@dataclass(frozen=True, slots=True)
class Overhead:
    """One measured pass.

    Attributes
    ----------
    requests, bytes : int
        Requests the daemon served and bytes read.
    modelled_s, wall_s : float
        Sum of modelled costs; the reader's wall time.
    daemon_median : float
        Median over requests of (service - modelled) / modelled.
    reader_median : float
        Median over requests of (interval to the reader's next request) / modelled - 1:
        what the reader pays per request beyond the model, robust to the reader being
        preempted now and then by other jobs.
    client : float
        wall / sum(modelled) - 1: the same over the whole read, outliers included.
    """

    requests: int
    bytes: int
    modelled_s: float
    wall_s: float
    daemon_median: float
    reader_median: float
    client: float

    @property
    def mbps(self) -> float:
        """Achieved MB/s."""
        return self.bytes / self.wall_s / 1e6


def measure_overhead(
    *,
    size: int = 64 << 20,
    block: int = 1 << 20,
    repeats: int = 3,
    params: EmulatorParams | None = None,
    workdir: str | None = None,
) -> list[Overhead]:
    """Run *repeats* passes over a *size*-byte file in *block* reads; one result each."""
    with tempfile.TemporaryDirectory(prefix="feedline-emu-overhead-", dir=workdir) as d:
        src = os.path.join(d, "src")
        os.mkdir(src)
        path = os.path.join(src, "data.bin")
        with open(path, "wb") as f:
            for _ in range(0, size, 8 << 20):
                f.write(os.urandom(min(8 << 20, size - f.tell())))
        out = []
        with Emulator(src, os.path.join(d, "mnt"), nodes=1, params=params) as emu:
            buf = mmap.mmap(-1, block)
            for _ in range(repeats):
                emu.reset_stats()
                fd = os.open(emu.node_path(0) / "data.bin", os.O_RDONLY | os.O_DIRECT)
                t0 = time.perf_counter()
                try:
                    for off in range(0, size, block):
                        os.preadv(fd, [buf], off)
                finally:
                    os.close(fd)
                wall = time.perf_counter() - t0
                reqs = emu.requests()
                modelled = sum(r["modelled_s"] for r in reqs)
                daemon = statistics.median(
                    (r["service_s"] - r["modelled_s"]) / r["modelled_s"] for r in reqs
                )
                reader = statistics.median(
                    (b["arrival_s"] - a["arrival_s"]) / a["modelled_s"] - 1
                    for a, b in itertools.pairwise(reqs)
                )
                out.append(
                    Overhead(len(reqs), size, modelled, wall, daemon, reader, wall / modelled - 1)
                )
            buf.close()
        return out
