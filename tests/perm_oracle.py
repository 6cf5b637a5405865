# SPDX-License-Identifier: Apache-2.0
"""The reference of feedline's keyed permutation: the numpy expression feedline evaluated
before ``feedline._core.permute`` (cpp/src/permute.cpp) replaced it. Tests check that the
native permutation gives these exact values, so that plans, checkpoints and resume stay
the same across the change and on every machine."""

from __future__ import annotations

import numpy as np

from feedline.plan._perm import mix64  # the round function, shared with subkeys

_ROUNDS = 6  # even, so the half widths return to their start
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _bits(n: np.ndarray) -> np.ndarray:
    # bit length of n-1 (exact below 2**53), at least 2 so both halves are non-empty
    _, e = np.frexp(np.maximum(n - 1, 0).astype(np.float64))
    return np.maximum(e.astype(np.int64), 2).astype(np.uint64)


def _round_keys(key: np.ndarray) -> list[np.ndarray]:
    with np.errstate(over="ignore"):
        return [mix64(key + np.uint64(i + 1) * _GOLDEN) for i in range(_ROUNDS)]


def _feistel(x, wl, wr, rk, inverse: bool):
    one = np.uint64(1)
    L = x >> wr
    R = x & ((one << wr) - one)
    if not inverse:
        for k in rk:
            F = mix64(R ^ k) & ((one << wl) - one)
            L, R = R, L ^ F
            wl, wr = wr, wl
    else:
        # undo rounds in reverse; before the inverse the halves are (wl, wr) as output
        for k in reversed(rk):
            wl, wr = wr, wl  # widths as they were before this forward round
            # forward: (L, R) -> (R, L ^ F(R)); here L holds old R (width wr), R holds new R
            oldR = L
            F = mix64(oldR ^ k) & ((one << wl) - one)
            oldL = R ^ F
            L, R = oldL, oldR
    return (L << wr) | R


def permute(x, n, key, *, inverse: bool = False) -> np.ndarray:
    """feedline.plan._perm.permute as numpy evaluated it (same arguments, same values)."""
    x = np.asarray(x, dtype=np.int64)
    shape = x.shape
    x = x.ravel()
    n = np.broadcast_to(np.asarray(n, dtype=np.int64), shape).ravel()
    key = np.broadcast_to(np.asarray(key, dtype=np.uint64), shape).ravel()
    if x.size == 0:
        return x.reshape(shape)
    if (x < 0).any() or (x >= n).any():
        raise IndexError("position outside the permutation's domain")
    bits = _bits(n)
    wl = bits >> np.uint64(1)
    wr = bits - wl
    rk = _round_keys(key)
    y = _feistel(x.astype(np.uint64), wl, wr, rk, inverse)
    un = n.astype(np.uint64)
    todo = np.flatnonzero(y >= un)
    while todo.size:  # cycle walking back into [0, n)
        y[todo] = _feistel(y[todo], wl[todo], wr[todo], [k[todo] for k in rk], inverse)
        todo = todo[y[todo] >= un[todo]]
    return y.astype(np.int64).reshape(shape)
