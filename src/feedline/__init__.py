# SPDX-License-Identifier: Apache-2.0
"""feedline: training data at the speed of the storage, at any scale.

>>> from feedline import Loader, open_dataset
>>> ds = open_dataset("/lustre/cifar10_large_lmdb")
>>> loader = Loader(ds, batch_size=1024)
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version
from typing import Any

from .dataset import Dataset, open_dataset
from .errors import (
    ConcurrencyError,
    ConfigError,
    CorruptDataError,
    DatasetNotFoundError,
    FeedlineError,
    PeerFailedError,
    PeerTimeoutError,
    StaleDatasetError,
    StaleIndexError,
    StateError,
    StateMismatchError,
    StorageError,
    StorageTimeoutError,
    UnsupportedFormatError,
)
from .index import Index

try:  # one version: the installed distribution's (pyproject.toml)
    __version__ = _dist_version("feedline")
except PackageNotFoundError:  # pragma: no cover - a source tree on sys.path, not installed
    __version__ = "0+unknown"

_LAZY = {
    "Loader": ("feedline.loader", "Loader"),
    "Batch": ("feedline.loader", "Batch"),
    "randomization_level": ("feedline.plan.rl", "randomization_level"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'feedline' has no attribute {name!r}")


__all__ = [
    "Batch",
    "ConcurrencyError",
    "ConfigError",
    "CorruptDataError",
    "Dataset",
    "DatasetNotFoundError",
    "FeedlineError",
    "Index",
    "Loader",
    "PeerFailedError",
    "PeerTimeoutError",
    "StaleDatasetError",
    "StaleIndexError",
    "StateError",
    "StateMismatchError",
    "StorageError",
    "StorageTimeoutError",
    "UnsupportedFormatError",
    "open_dataset",
    "randomization_level",
]
