# SPDX-License-Identifier: Apache-2.0
"""Memory sweep probe: peak memory of each preset against the memory cap it accepted.

    memory_probe.py OUT.json --data DIR --cap BYTES|tight [--batch B] [--presets P1,P2] [--epochs E]

Each preset first runs one warm-up epoch under an unlimited cap (lazy imports, thread
start-up and the allocator's first growth belong to the process, not the configuration).
With ``--cap tight`` each preset then gets the smallest cap it should accept: its
estimate under the unlimited cap plus 2 %, plus 1 MiB per rank of the node for what the
estimate does not model (thread stacks, plans, Python objects; 0.1-0.6 MiB measured).

Runs alone (1 rank) or under mpiexec. For each preset a Loader is built with
``memory_cap=cap``; a construction error (``ConfigError``) is recorded as *rejected*. An
accepted Loader is iterated for E epochs while a sampler thread reads, every 2 ms, this
process's anonymous resident memory (``RssAnon``, the heap and buffers: file pages of
mapped datasets or sidecars are page cache, not the loader's) and, on every
rank, every 20 ms, the resident bytes of each shared-memory segment (``/dev/shm``, also
unlinked ones, and System V) mapped since the Loader was built. A node's peak is the sum
of its ranks' peak anonymous growth (over the value just before the Loader was built)
plus the peak of the new segments mapped at one time (every rank of a node maps the
same segments: the largest rank's figure counts, once per node). That is compared with
the cap (a per-node figure, like the cap). Rank 0 writes the result.
"""

from __future__ import annotations

import argparse
import gc
import json
import threading
import time

import numpy as np

PERIOD = 0.002
#: per rank, what a Loader holds besides the buffers its estimate counts (thread stacks,
#: plans, Python objects; 0.1-0.6 MiB measured): added to a tight cap
RUNTIME_ALLOWANCE = 1 << 20


def rss_anon() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def shm_segments() -> dict[tuple[str, str], int]:
    """Resident bytes of each shared-memory mapping of this process, by (device, inode):
    POSIX/MPI segments in /dev/shm (often already unlinked) and System V segments."""
    out: dict[tuple[str, str], int] = {}
    key = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(None, 5)
            if len(head) >= 5 and "-" in head[0] and ":" in head[3]:
                path = head[5].strip() if len(head) > 5 else ""
                shared = path.startswith("/dev/shm/") or path.startswith("/SYSV")
                key = (head[3], head[4]) if shared and head[4] != "0" else None
            elif key is not None and line.startswith("Rss:"):
                out[key] = out.get(key, 0) + int(line.split()[1]) * 1024
    return out


class Sampler:
    def __init__(self) -> None:
        # the sampler's own first allocations (smaps parsing, its thread) happen before base
        self.shm_before = set(shm_segments())
        self.peak_anon = self.peak_shm = 0
        self._stop = threading.Event()
        self._go = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        self._go.wait()
        gc.collect()
        self.base = rss_anon()
        self.peak_anon = self.base

    def _run(self) -> None:
        self.sample()
        self._go.set()
        k = 0
        while not self._stop.is_set():
            self.sample(shm=k % 10 == 0)
            k += 1
            time.sleep(PERIOD)

    def sample(self, shm: bool = True) -> None:
        self.peak_anon = max(self.peak_anon, rss_anon())
        if shm:  # segments mapped now (one epoch's window is freed before the next's)
            now = sum(v for k, v in shm_segments().items() if k not in self.shm_before)
            self.peak_shm = max(self.peak_shm, now)

    def stop(self) -> tuple[int, int]:
        self._stop.set()
        self._t.join()
        self.sample()
        return self.peak_anon - self.base, self.peak_shm


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--data", required=True)
    ap.add_argument("--cap", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--presets", required=True)
    ap.add_argument("--epochs", type=int, default=2)
    a = ap.parse_args()
    from feedline import Loader, open_dataset
    from feedline.dist import launcher_comm
    from feedline.errors import ConfigError

    comm = launcher_comm()
    ds = open_dataset(a.data, comm=comm)
    len(ds)
    results = {}
    for preset in a.presets.split(","):
        # One warm-up epoch under an unlimited cap: lazy imports, thread start-up and the
        # allocator's first growth are the process's, not this configuration's.
        with Loader(ds, a.batch, preset=preset, decode=False, comm=comm,
                    memory_cap=1 << 50) as warm:  # fmt: skip
            for _ in warm:
                pass
            rpn = warm.world.ranks_per_node
            tight = int(warm.memory_estimate()["total"] * 1.02) + rpn * RUNTIME_ALLOWANCE
        cap = tight if a.cap == "tight" else int(a.cap)
        sampler = Sampler()  # before the Loader allocates anything
        try:
            ld = Loader(ds, a.batch, preset=preset, decode=False, comm=comm, memory_cap=cap)
        except ConfigError as e:
            sampler.stop()
            results[preset] = {"cap": cap, "rejected": str(e)}
            continue
        world = ld.world
        n = 0
        with ld:
            for epoch in range(a.epochs):
                ld.set_epoch(epoch)
                for b in ld:
                    n += len(b.ids)
            estimate = ld.memory_estimate()
            source = ld.stats().get("source")
        anon, shm = sampler.stop()
        del ld
        gc.collect()
        mine = {"anon": anon, "shm": shm, "node": world.node if hasattr(world, "node") else 0,
                "samples": n}  # fmt: skip
        everyone = comm.allgather(mine) if comm is not None else [mine]
        nodes: dict[int, int] = {}
        shared: dict[int, int] = {}
        for r in everyone:  # anonymous memory per rank; the node's segments once
            nodes[r["node"]] = nodes.get(r["node"], 0) + r["anon"]
            shared[r["node"]] = max(shared.get(r["node"], 0), r["shm"])
        for node, v in shared.items():
            nodes[node] += v
        results[preset] = {
            "cap": cap,
            "estimate": estimate,
            "source": source,
            "ranks": everyone,
            "node_peak": max(nodes.values()),
            "ratio": max(nodes.values()) / cap,
            "samples": sum(r["samples"] for r in everyone),
        }
    if comm is None or comm.rank == 0:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    np.seterr(all="raise")
    main()
