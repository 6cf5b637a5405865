# SPDX-License-Identifier: Apache-2.0
"""I/O staggering (LMDBIO §4.6): readers in groups of n, one group reading at a time.

Readers are listed node by node (neighbouring nodes read neighbouring parts of the file
under the sequential assignments), cut into G = ceil(R / n) consecutive groups of n and
labelled 0..n-1 inside their group. There are n tokens; a reader performs a read only
while holding its label's token and then passes it to the reader with the same label in
the next group that has that label, wrapping around to the first group for the next
round. Fewer concurrent requests mean less interleaving at the servers; too few lose
parallelism, so n is a knob (``Strategy.stagger``; 0 = off).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .plan import Plan


@dataclass(frozen=True, slots=True)
class StaggerInfo:
    """Where a reader sits in the token ring.

    Attributes
    ----------
    enabled : bool
        False when staggering is off or there is a single group.
    group, label : int
        The reader's group and label (index inside its group).
    groups : int
        Number of groups G.
    size : int
        Group size n (number of tokens).
    recv_from : int or None
        Rank the token comes from (the same label in the previous group having it).
    send_to : int or None
        Rank the token goes to after this reader's read.
    starts : bool
        True for readers of group 0: they hold their token at the start of round 0.
    """

    enabled: bool
    group: int
    label: int
    groups: int
    size: int
    recv_from: int | None
    send_to: int | None
    starts: bool


def stagger_groups(readers: list[int], n: int) -> list[list[int]]:
    """Consecutive groups of *n* readers (the last may be shorter)."""
    n = max(1, n)
    return [readers[i : i + n] for i in range(0, len(readers), n)]


def stagger_info(plan: Plan, reader: int) -> StaggerInfo:
    """Token ring position of *reader* in *plan*."""
    readers = plan.readers
    if reader not in readers:
        raise ValueError(f"rank {reader} is not a reader")
    i = readers.index(reader)
    n = plan.strategy.stagger
    if n <= 0 or n >= len(readers):
        return StaggerInfo(False, 0, i, 1, len(readers), None, None, True)
    groups = stagger_groups(readers, n)
    g, label = divmod(i, n)
    G = len(groups)

    def with_label(h: int) -> int:
        # nearest group from h onwards (cyclically) that has this label
        for d in range(G):
            grp = groups[(h + d) % G]
            if label < len(grp):
                return grp[label]
        raise AssertionError("unreachable")  # pragma: no cover

    def with_label_back(h: int) -> int:
        for d in range(G):
            grp = groups[(h - d) % G]
            if label < len(grp):
                return grp[label]
        raise AssertionError("unreachable")  # pragma: no cover

    send_to = with_label(g + 1)
    recv_from = with_label_back(g - 1)
    return StaggerInfo(True, g, label, G, n, recv_from, send_to, g == 0)
