# SPDX-License-Identifier: Apache-2.0
"""A batch's copy out of its read window, side by side: ``feedline.pipeline.reader.gather``
(one native memcpy per record, ``_core.copy_records``) against the numpy fancy-indexing
copy it replaced (a strided view of the window, a temporary, a second copy), interleaved
in one process, each call into a fresh output as the Loader makes one per batch
(docs/loader.md, "What a batch is").

    python dev/gather_ab.py [RECORDS_PER_BATCH] [RECORD_BYTES] [WINDOW_MIB] [CALLS]

Defaults: 256 records of 3,085 B (a CIFAR10-Large step of 8 ranks at global batch 2048)
at random offsets of a 64 MiB window, 400 calls each.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

from feedline.pipeline.reader import gather


def numpy_gather(buf: np.ndarray, src: np.ndarray, length: int) -> np.ndarray:
    """The replaced expression, for fixed-size records at arbitrary offsets."""
    out = np.empty(len(src) * length, dtype=np.uint8)
    rows = np.lib.stride_tricks.sliding_window_view(buf[: int(src.max()) + length], length)
    out.reshape(len(src), length)[...] = rows[src]
    return out


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    length = int(sys.argv[2]) if len(sys.argv) > 2 else 3085
    window = (int(sys.argv[3]) if len(sys.argv) > 3 else 64) << 20
    calls = int(sys.argv[4]) if len(sys.argv) > 4 else 400
    rng = np.random.default_rng(0)
    buf = rng.integers(0, 256, window, dtype=np.uint8)
    lengths = np.full(n, length, dtype=np.int64)
    native, numpy_ = [], []
    for k in range(calls):
        src = rng.integers(0, window - length, n)
        for fn, times in ((0, native), (1, numpy_)) if k % 2 else ((1, numpy_), (0, native)):
            t0 = time.perf_counter()
            out = gather(buf, src, lengths) if fn == 0 else numpy_gather(buf, src, length)
            times.append(time.perf_counter() - t0)
            assert out[:length].tobytes() == buf[src[0] : src[0] + length].tobytes()
    a, b = statistics.median(native), statistics.median(numpy_)
    print(
        f"{n} records of {length} B from a {window >> 20} MiB window, median of {calls}: "
        f"native {1e6 * a:.0f} us, numpy {1e6 * b:.0f} us ({b / a:.1f}x)"
    )


if __name__ == "__main__":
    main()
