#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Write the seed corpora of the fuzz targets (cpp/fuzz and tests/fuzz_py.py) to a directory.

Seeds are generated, never stored in git: small valid files of every format (LMDB files
written by liblmdb through py-lmdb, with inline and overflow values, one and several tree
levels, long keys (deeper trees); TFRecord files; Caffe Datums; .npy headers; sidecars; saved loader
states) plus a few near-misses.

    python dev/fuzz_seeds.py OUT_DIR        -> OUT_DIR/<target>/seed-*
"""

from __future__ import annotations

import io
import os
import sys
import tempfile

import numpy as np


def _key(i: int, long: bool) -> bytes:
    return f"{i:08d}".encode() * (25 if long else 1)


def _lmdb_seeds() -> list[bytes]:
    import lmdb

    out = []
    shapes = [(1, 8), (40, 100), (300, 20), (3, 5000), (60, 1500)]
    for n, vlen in shapes:
        for long_keys in (False, True):
            with tempfile.TemporaryDirectory() as d:
                env = lmdb.open(d, map_size=1 << 22, subdir=True)
                with env.begin(write=True) as txn:
                    for i in range(n):
                        txn.put(_key(i, long_keys), bytes([i % 251]) * vlen)
                    if n > 10:  # some free pages
                        for i in range(0, n, 7):
                            txn.delete(_key(i, long_keys))
                env.close()
                with open(os.path.join(d, "data.mdb"), "rb") as f:
                    data = f.read()
                # trim the map's trailing zeros beyond the last used page
                out.append(data.rstrip(b"\0") + b"\0" * 16)
                out.append(data[: 1 << 16])
    return [s[: 1 << 16] for s in out]


def _tfrecord_seeds() -> list[bytes]:
    from feedline.formats.tfrecord import frames

    rng = np.random.default_rng(0)
    seeds = [b""]
    for n, ln in [(1, 0), (1, 10), (5, 100), (20, 3), (2, 3000)]:
        seeds.append(frames([rng.bytes(ln) for _ in range(n)]))
    seeds.append(seeds[3][:-3])  # truncated
    return seeds


def _datum_seeds() -> list[bytes]:
    from feedline.formats.datum_write import encode_datum

    seeds = []
    for c, hw in [(1, 1), (3, 2), (1, 4), (4, 8)]:
        prefix = bytes([c - 1, hw - 1])
        d = encode_datum(c, hw, hw, bytes(range(c * hw * hw)), label=7)
        seeds.append(prefix + d * 4)
        seeds.append(prefix + encode_datum(c, hw, hw, float_data=[0.5] * (c * hw * hw)) * 4)
        seeds.append(
            prefix + encode_datum(c, hw, hw, float_data=[1.5] * (c * hw * hw), packed=True) * 4
        )
        seeds.append(prefix + encode_datum(0, 0, 0, b"\xff\xd8jpeg", label=3, encoded=True) * 4)
        seeds.append(prefix + encode_datum(c, hw, hw, bytes(c * hw * hw), encoded=None))
    return seeds


def _npy_seeds() -> list[bytes]:
    seeds = []
    for arr in [
        np.zeros((3, 4), "<f4"),
        np.arange(10, dtype=">i8"),
        np.zeros((2, 2), "u1"),
        np.zeros((0, 5), "<f8"),
        np.zeros((2,), [("a", "<i4"), ("b", "u1", (3,))]),
    ]:
        b = io.BytesIO()
        np.save(b, arr)
        seeds.append(b.getvalue())
    b = io.BytesIO()
    np.lib.format.write_array(b, np.zeros((2, 3), "<f4"), version=(2, 0))
    seeds.append(b.getvalue())
    b = io.BytesIO()
    np.save(b, np.zeros((2, 3), "<f4", order="F").T)
    seeds.append(b.getvalue())
    return seeds


def _sidecar_seeds() -> list[bytes]:
    from feedline import index as fi

    seeds = []
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "a.bin")
        with open(data, "wb") as f:
            f.write(bytes(range(256)) * 4)
        for keys in (None, [b"k%d" % i for i in range(4)]):
            ix = fi.Index(
                files=[data],
                file_ids=np.zeros(4, np.int32),
                offsets=np.arange(4) * 100,
                lengths=np.full(4, 100),
                labels=np.arange(4, dtype=np.int64),
                keys=fi.Keys.from_list(keys) if keys else None,
                meta={"fmt": "x"},
            )
            p = os.path.join(d, "s.fidx")
            fi.write_sidecar(p, ix, root=d, fingerprints=[fi.fingerprint(data)], key="k")
            with open(p, "rb") as f:
                seeds.append(f.read())
    return seeds


def _state_seeds() -> list[bytes]:
    import json

    base = {"epoch": 1, "step": 3, "seed": 5, "chain": [[1, 1, 0]], "world_size": 1}
    return [
        json.dumps(base).encode(),
        json.dumps({**base, "step": 10**12}).encode(),
        json.dumps({**base, "chain": [[2, 1, 0], [1, 1, 4]], "world_size": 1}).encode(),
        json.dumps({**base, "chain": [[0, 0, 0]], "world_size": 0, "nodes": 0}).encode(),
        json.dumps({**base, "strategy": {"assignment": "chunk"}}).encode(),
        b"{}",
    ]


def _fdp_seeds() -> list[bytes]:
    """Inputs of the targets that draw parameters with atheris' FuzzedDataProvider."""
    rng = np.random.default_rng(3)
    return [bytes(8), b"\xff" * 16] + [rng.bytes(int(k)) for k in (12, 40, 200, 1000)]


#: target name -> seed generator (C++ targets first)
TARGETS = {
    "fuzz_lmdb_index": _lmdb_seeds,
    "fuzz_lmdb_pages": _lmdb_seeds,
    "fuzz_tfrecord": _tfrecord_seeds,
    "fuzz_datum": _datum_seeds,
    "py_npy": _npy_seeds,
    "py_sidecar": _sidecar_seeds,
    "py_state": _state_seeds,
    "py_hdf5": _fdp_seeds,
    "py_records": _fdp_seeds,
}


def write(out: str, targets: list[str] | None = None) -> dict[str, int]:
    counts = {}
    for name in targets or list(TARGETS):
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        seeds = TARGETS[name]()
        for i, s in enumerate(seeds):
            with open(os.path.join(d, f"seed-{i:03d}"), "wb") as f:
                f.write(s)
        counts[name] = len(seeds)
    return counts


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for k, v in write(sys.argv[1], sys.argv[2:] or None).items():
        print(f"{k}: {v} seeds")
