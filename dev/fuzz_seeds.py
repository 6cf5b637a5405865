#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Write the seed corpora of the fuzz targets (cpp/fuzz and tests/fuzz_py.py) to a directory.

Seeds are generated, never stored in git: small valid files of every format (LMDB files
written by liblmdb through py-lmdb, with inline and overflow values, one and several tree
levels, long keys (deeper trees); TFRecord files, gzip TFRecord files (written with zlib, one
and several members) and HDF5 chunks (stored bytes written by h5py: deflate, shuffle, LZF);
Caffe Datums; .npy headers; sidecars; saved loader states) plus a few near-misses.

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


def _gzip_member_raw(data: bytes, flags: int = 0, level: int = 6, strategy: int = 0) -> bytes:
    """A gzip member written by hand: header *flags* (FTEXT 1, FHCRC 2, FEXTRA 4, FNAME 8,
    FCOMMENT 16) with their fields, raw deflate of *data*, CRC-32 and size trailer."""
    import struct
    import zlib

    head = b"\x1f\x8b\x08" + bytes([flags]) + b"\0\0\0\0\0\xff"
    if flags & 4:
        head += struct.pack("<H", 6) + b"AB\x02\0xy"
    if flags & 8:
        head += b"data.tfrecord\0"
    if flags & 16:
        head += b"a comment\0"
    if flags & 2:
        head += struct.pack("<H", zlib.crc32(head) & 0xFFFF)
    z = zlib.compressobj(level, zlib.DEFLATED, -15, 8, strategy)
    body = z.compress(data) + z.flush()
    return head + body + struct.pack("<II", zlib.crc32(data), len(data) & 0xFFFFFFFF)


def _gzip_tfrecord_seeds() -> list[bytes]:
    """gzip TFRecord files: one and many members, members that cut a record in two,
    streams long enough for restart points inside a member (> 64 KiB of output, several
    deflate blocks, within the 64 KiB input limit), every header field, full flushes
    (byte-aligned blocks), stored, fixed-Huffman and RLE blocks, and near misses."""
    import zlib

    from feedline.formats.tfrecord import frames, gzip_member

    rng = np.random.default_rng(5)

    def low_entropy(n: int) -> bytes:  # ~1 bit per byte: 270 KiB deflate to ~45 KiB
        return (rng.integers(0, 2, n, dtype=np.uint8) + 97).tobytes()

    def blocks(data: bytes) -> bytes:  # memLevel 4: deflate blocks of 1024 symbols
        z = zlib.compressobj(6, zlib.DEFLATED, 31, 4)
        return z.compress(data) + z.flush()

    small = frames([rng.bytes(int(n)) for n in (0, 1, 10, 100)])
    big = frames([low_entropy(int(n)) for n in rng.integers(500, 9000, 60)])
    seeds = [b"", gzip_member(b""), gzip_member(small), gzip_member(small, level=1)]
    seeds.append(blocks(big))  # restart points inside the member
    # a record split between two members (`cat a.gz b.gz`), read from a restart point
    # inside the first
    cut = len(big) // 2 + 5
    seeds.append(blocks(big[:cut]) + blocks(big[cut:]))
    seeds.append(gzip_member(small[:7]) + gzip_member(small[7:]))
    seeds.append(gzip_member(b"") + gzip_member(small) + gzip_member(b""))
    parts = [frames([low_entropy(300)]) for _ in range(6)]  # members on record boundaries
    seeds.append(b"".join(gzip_member(p) for p in parts))
    for flags in (2, 4, 8, 16, 31):
        seeds.append(_gzip_member_raw(small, flags))
    for strategy in (zlib.Z_FILTERED, zlib.Z_HUFFMAN_ONLY, zlib.Z_RLE, zlib.Z_FIXED):
        seeds.append(_gzip_member_raw(small, 0, 6, strategy))
    seeds.append(_gzip_member_raw(small, 0, 0))  # stored blocks
    # full flushes every 20 KiB: byte-aligned block boundaries (restarts with 0 bits)
    z = zlib.compressobj(6, zlib.DEFLATED, 31)
    body = b"".join(
        z.compress(big[i : i + 20000]) + z.flush(zlib.Z_FULL_FLUSH)
        for i in range(0, len(big), 20000)
    )
    seeds.append(body + z.flush())
    # near misses: truncated, trailing garbage, not a TFRecord inside, bad payload CRC
    seeds.append(seeds[2][:-5])
    seeds.append(seeds[2] + b"\x00garbage")
    seeds.append(gzip_member(b"just some text, not TFRecord frames"))
    bad = bytearray(small)
    bad[-1] ^= 1
    seeds.append(gzip_member(bytes(bad)))
    return [s for s in seeds if len(s) <= 1 << 16]


def _hdf5_chunk_seeds() -> list[bytes]:
    """Stored HDF5 chunks written by h5py (deflate, shuffle + deflate, LZF, shuffle + LZF,
    shuffle alone, Fletcher32), read back with read_direct_chunk, each behind the 5-byte
    prefix fuzz_unpack_chunk reads: pipeline | mask << 3, element size - 1, chunk size
    (3 bytes, little-endian). LZF on incompressible data gives a chunk whose mask skips it."""
    import h5py

    # pipeline ids of cpp/fuzz/fuzz_unpack_chunk.cpp
    kinds = {
        0: {"compression": "gzip"},
        1: {"compression": "gzip", "shuffle": True},
        2: {"compression": "lzf"},
        3: {"compression": "lzf", "shuffle": True},
        4: {"shuffle": True},
        5: {"compression": "gzip", "shuffle": True, "fletcher32": True},
    }
    rng = np.random.default_rng(7)
    arrays = [
        np.arange(1000, dtype="<f4"),
        (np.arange(4099) % 7).astype("<i2"),
        np.linspace(0, 1, 777).astype("<f8"),
        rng.integers(0, 255, 2000).astype("u1"),  # incompressible for LZF
        np.zeros(1, "<i4"),
        np.tile(np.arange(3, dtype="<u4"), 1001),
    ]
    seeds = []
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "chunks.h5")
        with h5py.File(path, "w") as f:
            for kind, opts in kinds.items():
                for j, a in enumerate(arrays):
                    if kind != 0 and j >= 4 and j != 5:
                        continue
                    ds = f.create_dataset(f"k{kind}_{j}", data=a, chunks=a.shape, **opts)
                    mask, stored = ds.id.read_direct_chunk((0,))
                    head = bytes([kind | (mask & 7) << 3, a.dtype.itemsize - 1])
                    head += a.nbytes.to_bytes(3, "little")
                    seeds.append(head + stored)
    # hand-made LZF: a literal run and an overlapping back-reference ("abc" * 4)
    seeds.append(bytes([2, 0, 12, 0, 0]) + bytes([2, 97, 98, 99, 7 << 5, 0, 2]))
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
    "fuzz_unpack_chunk": _hdf5_chunk_seeds,
    "fuzz_gzip_tfrecord": _gzip_tfrecord_seeds,
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
