# SPDX-License-Identifier: Apache-2.0
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


class StorageTimeoutError(StorageError):
    """A read that did not complete within ``timeout_s`` (a stalled file system).

    The read is abandoned: its thread finishes in the background and its buffer is
    never reused; the Loader that met it refuses to iterate again.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        offset: int,
        timeout_s: float,
        message: str | None = None,
    ) -> None:
        self.timeout_s = float(timeout_s)
        msg = message or (
            f"{os.fspath(path)} @ byte {int(offset)}: no reply from storage within "
            f"{self.timeout_s:g} s (timeout_s); the read was abandoned"
        )
        super().__init__(path, offset, _errno.ETIMEDOUT, msg)

    def __reduce__(self):
        return (type(self), (self.path, self.offset, self.timeout_s, str(self.args[0])))


class PeerFailedError(FeedlineError):
    """Another rank failed (its error, announced to every rank) or died.

    Attributes
    ----------
    rank : int
        The failed rank.
    reason : str
        Its error's type and text, or how it died.
    cause : BaseException or None
        Its exception, when it could be carried.
    """

    def __init__(self, rank: int, reason: str, cause: BaseException | None = None) -> None:
        self.rank = int(rank)
        self.reason = reason
        self.cause = cause
        super().__init__(f"rank {self.rank} failed: {reason}")

    def __reduce__(self):
        return (type(self), (self.rank, self.reason))


class PeerTimeoutError(FeedlineError, TimeoutError):
    """A wait for other ranks (token, collective, node window) exceeded its bound."""


class ConcurrencyError(FeedlineError, RuntimeError):
    """A Loader used in a way its concurrency contract refuses (two threads iterating
    it at once, use in a forked child, use after close)."""


class StateError(FeedlineError, ValueError):
    """A loader state that belongs to another dataset/configuration, or is damaged."""


class StateMismatchError(StateError):
    """A valid loader state taken with another dataset, seed or preset.

    ``Loader.load_state_dict(state, strict=False)`` accepts it anyway (the state's seed
    is adopted); other differences (batch size, sample order) cannot be resumed.
    """


class DatasetNotFoundError(FeedlineError, FileNotFoundError):
    """A dataset path that does not exist (a typo, an unmounted file system)."""

    def __init__(self, path: str | os.PathLike[str], reason: str = "no such file or directory"):
        self.path = os.fspath(path)
        self.reason = reason
        FeedlineError.__init__(self, f"{self.path}: {reason}")
        self.errno = _errno.ENOENT
        self.strerror = reason
        self.filename = self.path

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self):
        return (type(self), (self.path, self.reason))


__all__ = [
    "ConcurrencyError",
    "ConfigError",
    "CorruptDataError",
    "DatasetNotFoundError",
    "FeedlineError",
    "PeerFailedError",
    "PeerTimeoutError",
    "StaleDatasetError",
    "StaleIndexError",
    "StateError",
    "StateMismatchError",
    "StorageError",
    "StorageTimeoutError",
    "UnsupportedFormatError",
]
