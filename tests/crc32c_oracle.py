# SPDX-License-Identifier: Apache-2.0
"""CRC-32C (Castagnoli) in numpy: the tests' independent oracle for the native CRC32C
(``feedline._core.crc32c``, ``masked_crc32c``), which the library and the generators use.

Vectorised over many equal-length messages. A byte-at-a-time CRC
loop in Python runs at a few MB/s; this one uses linearity instead. The reflected CRC
step ``c' = T[(c ^ b) & 0xff] ^ (c >> 8)`` is affine over GF(2), so the register after
a block of K bytes is ``S^K(c)`` XOR the XOR of per-position tables ``P[p][byte]``
(the contribution of *byte* at distance K-1-p from the block end). One block of many
rows is then a table gather and an XOR-reduction, and ``S^K`` of the carried register
is four byte-table lookups. Trade-off: tables cost 1 KiB per block position (4 MiB for
the default 4 KiB block), built once per process.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

_POLY = 0x82F63B78  # reflected Castagnoli polynomial
_MASK_DELTA = 0xA282EAD8
_BLOCK = 4096


@lru_cache(maxsize=1)
def _table() -> np.ndarray:
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> np.uint32(1)) ^ np.uint32(_POLY), t >> np.uint32(1))
    return t.astype(np.uint32)


def _step(c: np.ndarray) -> np.ndarray:
    """S: one zero byte through the register (the linear part of a CRC step)."""
    return _table()[c & np.uint32(0xFF)] ^ (c >> np.uint32(8))


@lru_cache(maxsize=8)
def _tables(k: int) -> tuple[np.ndarray, np.ndarray]:
    """Position tables ``P`` (k, 256) and shift tables ``M`` (4, 256) for blocks of *k*."""
    pos = np.empty((k, 256), dtype=np.uint32)
    cur = _table().copy()
    for p in range(k - 1, -1, -1):
        pos[p] = cur
        cur = _step(cur)
    # M[i][v] = S^k(v << 8i): S^k is linear, so S^k(c) = XOR_i M[i][byte i of c]
    m = np.arange(256, dtype=np.uint32)[None, :] << (np.arange(4, dtype=np.uint32)[:, None] * 8)
    m = m.astype(np.uint32)
    for _ in range(k):
        m = _step(m)
    return pos, m


def _shift(c: np.ndarray, m: np.ndarray) -> np.ndarray:
    return (
        m[0][c & np.uint32(0xFF)]
        ^ m[1][(c >> np.uint32(8)) & np.uint32(0xFF)]
        ^ m[2][(c >> np.uint32(16)) & np.uint32(0xFF)]
        ^ m[3][c >> np.uint32(24)]
    )


def crc32c_rows(data: np.ndarray) -> np.ndarray:
    """CRC-32C of each row of a 2-D uint8 array (rows are equal-length messages).

    Returns
    -------
    numpy.ndarray of uint32, one CRC per row.
    """
    data = np.ascontiguousarray(data, dtype=np.uint8)
    if data.ndim != 2:
        raise ValueError("crc32c_rows wants a 2-D array of messages")
    n, length = data.shape
    c = np.full(n, 0xFFFFFFFF, dtype=np.uint32)
    for start in range(0, length, _BLOCK):
        block = data[:, start : start + _BLOCK]
        k = block.shape[1]
        pos, m = _tables(k)
        contrib = pos[np.arange(k)[None, :], block]
        c = _shift(c, m) ^ np.bitwise_xor.reduce(contrib, axis=1)
    return c ^ np.uint32(0xFFFFFFFF)


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC-32C of one message."""
    arr = np.frombuffer(bytes(data), dtype=np.uint8)
    return int(crc32c_rows(arr.reshape(1, -1))[0])


def mask(crc: np.ndarray | int) -> np.ndarray | int:
    """TFRecord's masked CRC: rotate right by 15 bits and add a constant (mod 2**32)."""
    if isinstance(crc, np.ndarray):
        c = crc.astype(np.uint64)
        rot = ((c >> np.uint64(15)) | (c << np.uint64(17))) & np.uint64(0xFFFFFFFF)
        return ((rot + np.uint64(_MASK_DELTA)) & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    c = int(crc)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


__all__ = ["crc32c", "crc32c_rows", "mask"]
