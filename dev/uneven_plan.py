# SPDX-License-Identifier: Apache-2.0
"""The ``feedline`` preset's plan over JPEG-like record lengths (docs/planner.md,
"Measured (2026-11-26, eighth session)"): N records of lognormal lengths around 100 KB
(sigma 0.6) and 20 of 5-14 MB, in one file, planned by the cost model at 64 ranks on 8
nodes and 512 on 64 (batch 4 per rank, 2.5 GB cap, the parallel profile). Each shape
twice: windows counted as the sum of their longest records (what the planner does), and
as their count times the largest record (what it did before).

    python dev/uneven_plan.py [N]          # default 1,281,167 (ImageNet's train set)
"""

from __future__ import annotations

import sys

import numpy as np

from feedline.plan.cost import choose, get_profile
from feedline.plan.records import IndexRecords
from feedline.plan.world import WorldSpec


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_281_167
    rng = np.random.default_rng(0)
    ln = np.clip(rng.lognormal(np.log(100_000), 0.6, n), 2000, None).astype(np.int64)
    ln[rng.choice(n, 20, replace=False)] = rng.integers(5_000_000, 15_000_000, 20)
    off = np.concatenate([[0], np.cumsum(ln + 64)[:-1]])  # one file, 64 B headers
    print(
        f"{n} records: {ln.sum() / 1e9:.1f} GB, mean {ln.mean() / 1e3:.0f} KB, largest {ln.max() / 1e6:.1f} MB"
    )
    largest = int(ln.max())
    for how in ("sum of the k longest", "k x the largest"):
        rec = IndexRecords(np.zeros(n, np.int64), off, ln)
        if how != "sum of the k longest":
            rec.top_bytes = lambda k: int(k) * largest  # type: ignore[method-assign]
        for ranks, nodes in ((64, 8), (512, 64)):
            c = choose(
                rec,
                WorldSpec(ranks, nodes),
                4 * ranks,
                int(2.5e9),
                get_profile("parallel"),
                store="x",
            )
            b = c.best
            print(
                f"{how:21} {ranks:4} ranks: {b.label()}: {b.requests:,.0f} requests, "
                f"{b.mean_read / 2**20:.2f} MiB mean read, RL {b.rl:.3f}"
            )


if __name__ == "__main__":
    main()
