# SPDX-License-Identifier: Apache-2.0
"""Plain LMDBs (liblmdb through the lmdb package) whose records have uneven lengths."""

from __future__ import annotations

import lmdb
import numpy as np


def write_uneven_lmdb(
    path: str, n: int, median: int, sigma: float, seed: int, long: dict[int, int] | None = None
) -> np.ndarray:
    """*n* records of lognormal lengths around *median* bytes (*sigma*: the spread of
    their logarithm; 0.5-0.7 is that of JPEG files), record *i* of *long* that many
    bytes instead; keys ``%08d``. Returns the lengths."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(median), sigma, n), 16, None).astype(int)
    for i, size in (long or {}).items():
        lengths[i] = size
    env = lmdb.open(path, map_size=max(1 << 24, 2 * int(lengths.sum()) + (64 << 20)))
    with env.begin(write=True) as txn:
        for i, size in enumerate(lengths):
            txn.put(b"%08d" % i, rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    env.close()
    return lengths
