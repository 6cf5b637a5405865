# SPDX-License-Identifier: Apache-2.0
"""Helpers shared by the loader tests and their mpiexec scripts.

``make_records`` writes fixed-size records whose first 8 bytes are the sample id (the
rest pseudo-random), split over a few files, and opens them with the ``records`` format
when it is available, else with a minimal fixed-record format registered here (the
Format extension API: index by arithmetic, raw decoder).
"""

from __future__ import annotations

import os

import numpy as np

from feedline.dataset import Dataset
from feedline.errors import UnsupportedFormatError
from feedline.formats import FORMATS, get_format
from feedline.formats.base import Format, register
from feedline.index import Index


class _FixedRecords(Format):
    """Fixed-size records back to back in each file (test fallback for ``records``)."""

    name = "loader-test-fixed"
    options = ("record_bytes",)

    def build_index(self, progress: bool = False) -> Index:
        size = int(self.options["record_bytes"])
        fids, offs = [], []
        for i, f in enumerate(self.files):
            n = os.path.getsize(f) // size
            fids.append(np.full(n, i, dtype=np.int32))
            offs.append(np.arange(n, dtype=np.int64) * size)
        off = np.concatenate(offs)
        return Index(self.files, np.concatenate(fids), off, np.full(len(off), size))


if _FixedRecords.name not in FORMATS:
    register(_FixedRecords)


def record_bytes(n: int, size: int, seed: int = 7) -> np.ndarray:
    """The (n, size) uint8 contents: id in the first 8 bytes, then noise."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (n, size), dtype=np.uint8)
    data[:, :8] = np.arange(n, dtype=np.uint64).view(np.uint8).reshape(n, 8)
    return data


def write_records(
    directory: str, n: int, size: int, files: int = 3, seed: int = 7
) -> tuple[list[str], np.ndarray]:
    """Write n records of *size* bytes over *files* files; return (paths, contents)."""
    os.makedirs(directory, exist_ok=True)
    data = record_bytes(n, size, seed)
    per = -(-n // files)
    paths = []
    for f in range(files):
        p = os.path.join(directory, f"part{f:02d}.bin")
        data[f * per : (f + 1) * per].tofile(p)
        paths.append(p)
    return paths, data


def open_records(paths: list[str], size: int, comm=None) -> Dataset:
    """Open fixed-size record files with the real ``records`` format when it exists."""
    try:
        fmt = get_format("records")(paths, record_bytes=size, label_bytes=0, header_bytes=0)
    except (UnsupportedFormatError, ImportError, ModuleNotFoundError):
        fmt = _FixedRecords(paths, record_bytes=size)
    return Dataset(fmt, comm=comm, sidecar=False)


def make_records(
    directory: str, n: int = 300, size: int = 24, files: int = 3
) -> tuple[Dataset, np.ndarray]:
    """Write and open a small records dataset."""
    paths, data = write_records(directory, n, size, files)
    return open_records(paths, size), data
