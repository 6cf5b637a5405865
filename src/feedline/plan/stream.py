# SPDX-License-Identifier: Apache-2.0
"""The building blocks of an epoch's base sequence: the :class:`Stream` protocol, an
:class:`Assignment` (how a registered order builds its stream), and the sequences the
``assign_*`` modules share (:class:`Identity`, :class:`Explicit`, :class:`GroupSlots`).
The table of assignments is :mod:`feedline.plan.streams`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .strategy import Strategy


class Stream(Protocol):
    """The base sequence Q of an epoch: ``take(q)`` gives the sample ids at positions q."""

    n: int

    def take(self, q: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class Assignment:
    """A registered assignment: how to build its stream and which layout it uses."""

    name: str
    make: Callable[[int, Strategy, np.uint64], Stream]
    layout: Callable[[Strategy], str]
    world_independent: Callable[[Strategy], bool]
    #: optional: build the stream knowing the epoch geometry (steps, batch) and the
    #: records (their mean length sizes the chunk layout's tiles), and the epoch
    make_geo: Callable[[int, Strategy, np.uint64, Any, Any, int], Stream] | None = None


class Identity:
    """Q = 0, 1, ..., n-1."""

    def __init__(self, n: int) -> None:
        self.n = n

    def take(self, q: np.ndarray) -> np.ndarray:
        return np.asarray(q, dtype=np.int64)


class Explicit:
    """Q given as an array (a resumed remainder)."""

    def __init__(self, ids: np.ndarray) -> None:
        self.ids = np.asarray(ids, dtype=np.int64)
        self.n = len(self.ids)

    def take(self, q: np.ndarray) -> np.ndarray:
        return self.ids[np.asarray(q, dtype=np.int64)]


class GroupSlots:
    """Groups of ``g`` contiguous samples (the last may be shorter) in a keyed order.

    Maps a position of the concatenated, permuted groups to ``(slot, group, offset)`` in
    O(1) per position: only the short last group shifts the slots after it.
    """

    def __init__(self, n: int, g: int, key: np.uint64) -> None:
        from ._perm import permute

        self.n, self.g = n, g
        self.groups = -(-n // g) if n else 0
        self.last = n - (self.groups - 1) * g if n else 0
        self.key = key
        self._permute = permute
        # slot of the short last group (its position after the permutation)
        self.short_slot = (
            int(permute(np.array([self.groups - 1]), self.groups, key, inverse=True)[0]) if n else 0
        )

    def group_at(self, slot: np.ndarray) -> np.ndarray:
        return self._permute(slot, self.groups, self.key)

    def slot_start(self, slot: np.ndarray) -> np.ndarray:
        slot = np.asarray(slot, dtype=np.int64)
        ts, g = self.short_slot, self.g
        return np.where(slot <= ts, slot * g, (slot - 1) * g + self.last)

    def size_of_group(self, group: np.ndarray) -> np.ndarray:
        return np.where(group == self.groups - 1, self.last, self.g)

    def locate(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(slot, group, offset within group)`` of positions *q*."""
        q = np.asarray(q, dtype=np.int64)
        g, ts = self.g, self.short_slot
        b = ts * g
        slot = np.where(
            q < b, q // g, np.where(q < b + self.last, ts, ts + 1 + (q - b - self.last) // g)
        )
        off = q - self.slot_start(slot)
        return slot, self.group_at(slot), off
