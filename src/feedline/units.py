# SPDX-License-Identifier: Apache-2.0
"""Byte sizes as users write them (``64MB``, ``64MiB``, ``2G``, ``2.5e9``, ``4096``) and
as people read them (``1 B``, ``64.0 MiB``); counts given on a command line
(:func:`count_at_least`).

One parser for every size feedline accepts (``memory_cap=``, ``FEEDLINE_MEMORY_CAP``,
``buffer=``, ``FEEDLINE_ASYNC_BUFFER``, bench flags): decimal units are powers of 1000,
``Ki``/``Mi``/``Gi``/``Ti`` powers of 1024, and a bare letter (``2G``) is decimal.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

from .errors import ConfigError

_UNITS = {"": 1, "b": 1}
for _i, _p in enumerate("kmgt", start=1):
    _UNITS[_p] = _UNITS[_p + "b"] = 1000**_i
    _UNITS[_p + "i"] = _UNITS[_p + "ib"] = 1 << (10 * _i)
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(value: int | float | str, what: str = "size") -> int:
    """``"64MiB"`` -> 67108864, ``"64MB"`` -> 64000000, ``"2.5e9"`` -> 2500000000.

    Plain numbers are bytes. Raises ConfigError naming *what* for anything else.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{what}: {value!r} is not a size")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        size = value
    else:
        m = _SIZE.match(str(value))
        if not m or m.group(2).lower() not in _UNITS:
            raise ConfigError(
                f"{what}: cannot read {value!r} as a size (e.g. 4096, 64MB, 64MiB, 2G, 2.5e9)"
            )
        size = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(size):
        raise ConfigError(f"{what}: {value!r} is not a finite size")
    return int(size)


def format_bytes(n: float) -> str:
    """``1`` -> ``"1 B"``, ``67108864`` -> ``"64.0 MiB"`` (binary units, one decimal)."""
    n = float(n)
    if abs(n) < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if abs(n) < 1024 or unit == "TiB":
            break
    return f"{n:.1f} {unit}"


def count_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type=``: a whole number of at least *low*, else an error that
    argparse prints naming the option (never a silent default for 0)."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = low - 1
        if n < low:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {low}, got {text!r}")
        return n

    return parse


__all__ = ["count_at_least", "format_bytes", "parse_bytes"]
