"""feedline's exception hierarchy.

Every failure a user can act on is a :class:`FeedlineError`. Data problems name the
file, the byte offset and the reason, so a corrupt record in a 200 GB dataset can be
found with ``dd`` and fixed.
"""

from __future__ import annotations

import errno as _errno
import os


class FeedlineError(Exception):
    """Base class of every error feedline raises on purpose."""


class ConfigError(FeedlineError, ValueError):
    """A configuration that cannot work (bad option, memory cap too small, ...)."""


class CorruptDataError(FeedlineError):
    """A dataset file contradicts its format.

    Parameters
    ----------
    path : str
        The file.
    offset : int
        Byte offset where the contradiction was found.
    reason : str
        What is wrong, in words.
    """

    def __init__(self, path: str | os.PathLike[str], offset: int, reason: str) -> None:
        self.path = os.fspath(path)
        self.offset = int(offset)
        self.reason = reason
        super().__init__(f"{self.path} @ byte {self.offset}: {reason}")

    def __reduce__(self):  # picklable across processes
        return (type(self), (self.path, self.offset, self.reason))


class UnsupportedFormatError(FeedlineError):
    """A valid file that uses something feedline does not read, or an unknown format."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")

    def __reduce__(self):
        return (type(self), (self.path, self.reason))


class StaleDatasetError(FeedlineError):
    """A cached index (sidecar) no longer matches the dataset files it describes."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"{self.path}: stale index: {reason}")

    def __reduce__(self):
        return (type(self), (self.path, self.reason))


class StaleIndexError(StaleDatasetError):
    """An index sidecar that cannot be trusted: stale, from another version or options,
    or changed after it was written (its content checksum does not match)."""


class StorageError(FeedlineError, OSError):
    """A persistent I/O failure (after retries), naming file, offset and errno."""

    def __init__(
        self, path: str | os.PathLike[str], offset: int, err: int, message: str | None = None
    ) -> None:
        self.path = os.fspath(path)
        self.offset = int(offset)
        self.err = int(err)
        name = _errno.errorcode.get(self.err, str(self.err))
        msg = message or f"{self.path} @ byte {self.offset}: {name} ({os.strerror(self.err)})"
        FeedlineError.__init__(self, msg)
        self.errno = self.err
        self.filename = self.path

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self):
        return (type(self), (self.path, self.offset, self.err, str(self.args[0])))


class StateError(FeedlineError, ValueError):
    """A loader state that belongs to another dataset/configuration, or is damaged."""


__all__ = [
    "ConfigError",
    "CorruptDataError",
    "FeedlineError",
    "StaleDatasetError",
    "StaleIndexError",
    "StateError",
    "StorageError",
    "UnsupportedFormatError",
]
