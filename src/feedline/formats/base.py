# SPDX-License-Identifier: Apache-2.0
"""The format contract: turn dataset files into an Index, and records into arrays.

A format is a small class registered by name. It resolves the user's path into a list
of files, builds an :class:`~feedline.index.Index` with explicit reads (never mmap, never
the format's own library for data), and makes a :class:`Decoder`. Formats only index and
decode: caching and sharing are the Dataset's job.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError, DatasetNotFoundError, UnsupportedFormatError
from ..index import Index


class Decoder(ABC):
    """Turns raw records into arrays.

    ``sample_shape``/``dtype`` are known when every decoded sample has one shape (so a
    batch can be decoded into one preallocated array); they are None otherwise.
    """

    sample_shape: tuple[int, ...] | None = None
    dtype: np.dtype | None = None

    @abstractmethod
    def decode(
        self, raw: np.ndarray, lengths: np.ndarray, ids: np.ndarray, out: np.ndarray | None = None
    ) -> tuple[Any, np.ndarray | None]:
        """Decode a batch.

        Parameters
        ----------
        raw : numpy.ndarray of uint8
            The records of the batch, concatenated.
        lengths : numpy.ndarray of int64
            Length of each record in *raw*.
        ids : numpy.ndarray of int64
            Global sample ids (for labels kept in the index).
        out : numpy.ndarray, optional
            Preallocated output of shape ``(len(ids), *sample_shape)``.

        Returns
        -------
        (data, labels)
        """


class RawDecoder(Decoder):
    """Records as bytes: ``(b, L)`` uint8 for fixed-size records, else flat uint8."""

    def __init__(self, index: Index) -> None:
        self._labels = index.labels
        fixed = index.fixed_length
        if fixed is not None:
            self.sample_shape = (fixed,)
            self.dtype = np.dtype(np.uint8)

    def decode(self, raw, lengths, ids, out=None):
        labels = None if self._labels is None else np.asarray(self._labels[ids])
        if self.sample_shape is not None:
            data = np.asarray(raw, dtype=np.uint8).reshape(len(lengths), *self.sample_shape)
            if out is not None:
                out[...] = data
                data = out
            return data, labels
        return np.asarray(raw, dtype=np.uint8), labels


class Format(ABC):
    """One dataset format. Subclasses set ``name`` and ``extensions``."""

    name: ClassVar[str]
    extensions: ClassVar[tuple[str, ...]] = ()
    #: option names this format accepts (others raise ConfigError)
    options: ClassVar[tuple[str, ...]] = ()

    def __init__(self, path: str | os.PathLike[str] | list, **options: Any) -> None:
        unknown = set(options) - set(self.options)
        if unknown:
            raise ConfigError(
                f"format {self.name!r} does not take option(s) {sorted(unknown)}; "
                f"it takes {list(self.options) or 'none'}"
            )
        #: the options given (a format may normalise them)
        self.opts: dict[str, Any] = dict(options)
        # the same dict as ``self.options`` for its readers (feedline.dataset); the class
        # attribute of that name lists the accepted options
        self.options = self.opts  # type: ignore[misc, assignment]  # an instance value over the ClassVar
        self.root, self.files = self.resolve(path)

    # ------------------------------------------------------------------ discovery
    @classmethod
    def sniff(cls, path: str) -> bool:
        """True when *path* (a file or directory) looks like this format."""
        return path.lower().endswith(cls.extensions) if cls.extensions else False

    def resolve(self, path: str | os.PathLike[str] | list) -> tuple[str, list[str]]:
        """``(root, files)`` for a file, a directory, a glob or a list of files."""
        return resolve_files(path, self.extensions, self.name)

    # ---------------------------------------------------------------- indexing
    @abstractmethod
    def build_index(self, progress: bool = False) -> Index:
        """Scan the files (explicit reads) and return the Index."""

    def sidecar_key(self) -> str:
        """Identifies what the index depends on besides file contents."""
        blob = json.dumps({"format": self.name, "options": self.opts}, sort_keys=True, default=str)
        return f"{self.name}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"

    def make_decoder(self, index: Index) -> Decoder:
        """The decoder for records of this format (raw bytes by default)."""
        return RawDecoder(index)

    def detect_decode(self, index: Index) -> str | None:
        """None when :meth:`make_decoder`'s decoder applies to these records, else why
        they are delivered as raw bytes (checked on the first records)."""
        return None

    def describe(self, index: Index) -> dict[str, Any]:
        """Format-specific layout facts for ``feedline inspect``."""
        return dict(index.meta)


def resolve_files(
    path: str | os.PathLike[str] | list, extensions: tuple[str, ...], name: str
) -> tuple[str, list[str]]:
    """Expand a path, directory, glob or list into (root, sorted absolute files)."""
    if isinstance(path, list | tuple):
        files = [os.path.abspath(os.fspath(p)) for p in path]
        if not files:
            raise ConfigError("empty list of dataset files")
        root = os.path.commonpath([os.path.dirname(f) for f in files])
    else:
        p = os.fspath(path)
        if any(c in p for c in "*?["):
            files = sorted(os.path.abspath(f) for f in glob.glob(p))
            if not files:
                raise DatasetNotFoundError(p, "no files match this pattern")
            root = os.path.commonpath([os.path.dirname(f) for f in files])
        elif os.path.isdir(p):
            root = os.path.abspath(p)
            files = sorted(
                os.path.join(root, f)
                for f in os.listdir(root)
                if not f.startswith(".")
                and (not extensions or f.lower().endswith(extensions))
                and os.path.isfile(os.path.join(root, f))
            )
            if not files:
                raise UnsupportedFormatError(p, f"directory holds no {name} files {extensions}")
        elif os.path.exists(p):
            files = [os.path.abspath(p)]
            root = os.path.dirname(files[0])
        else:
            raise DatasetNotFoundError(p)
    for f in files:
        if not os.path.isfile(f):
            raise DatasetNotFoundError(f, "no such dataset file")
    return root, files


FORMATS: dict[str, type[Format]] = {}


def register(cls: type[Format]) -> type[Format]:
    """Class decorator: make a format available to open_dataset by its name."""
    FORMATS[cls.name] = cls
    return cls


ProgressFactory = Callable[..., Any]
