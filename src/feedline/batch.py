# SPDX-License-Identifier: Apache-2.0
"""What the Loader delivers each step: :class:`Batch` (this rank's sub-batch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ConfigError


@dataclass(slots=True)
class Batch:
    """This rank's sub-batch of one step.

    Attributes
    ----------
    data : numpy.ndarray (or what ``transform`` returns)
        Decoded samples ``(b, ...)``; with ``decode=False`` raw bytes: ``(b, L)`` uint8
        for fixed-size records, else a flat uint8 array cut by ``lengths``.
    labels : numpy.ndarray or None
        Labels from the decoder or the index's label column.
    ids : numpy.ndarray of int64
        Global sample ids, in delivery order.
    lengths : numpy.ndarray of int64
        Raw record length of each sample.
    step, epoch : int
        Where in the run this batch belongs.
    nbytes : int
        Raw bytes of the sub-batch (the sum of ``lengths``).
    """

    data: Any
    labels: Any
    ids: np.ndarray
    lengths: np.ndarray
    step: int = 0
    epoch: int = 0
    nbytes: int = 0

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def ragged(self) -> bool:
        """True when :attr:`data` is variable-length raw records, concatenated (flat
        uint8 cut by :attr:`lengths`); see :meth:`samples` and :meth:`padded`."""
        d = self.data
        return (
            isinstance(d, np.ndarray)
            and d.ndim == 1
            and d.dtype == np.uint8
            and len(self.ids) != d.shape[0]
            and d.shape[0] == int(np.sum(self.lengths))
        ) or (isinstance(d, np.ndarray) and d.ndim == 1 and len(self.ids) == 0)

    def samples(self) -> list[np.ndarray]:
        """Each sample's record as its own uint8 array (views of :attr:`data`)."""
        if not self.ragged:
            return list(self.data)
        ends = np.cumsum(self.lengths)
        return [
            self.data[e - n : e] for e, n in zip(ends.tolist(), self.lengths.tolist(), strict=True)
        ]

    def padded(self, pad_to: int | None = None, fill: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """``(b, L)`` uint8 records padded with *fill* to *pad_to* (default: the longest
        of the batch), and the lengths. ConfigError when a record is longer."""
        lengths = np.asarray(self.lengths, dtype=np.int64)
        width = int(lengths.max(initial=0)) if pad_to is None else int(pad_to)
        if len(lengths) and int(lengths.max()) > width:
            raise ConfigError(f"a record of {int(lengths.max())} bytes exceeds pad_to={width}")
        out = np.full((len(lengths), width), fill, dtype=np.uint8)
        for k, rec in enumerate(self.samples()):
            out[k, : len(rec)] = rec
        return out, lengths
