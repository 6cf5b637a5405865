# SPDX-License-Identifier: Apache-2.0
"""The registry of assignments: each turns ``(n, strategy, key)`` into a *stream*.

A stream is the epoch's base sequence Q of sample ids, evaluated at any positions in
O(len(positions)); a *layout* (:mod:`feedline.plan.layout`) then places Q into steps and
ranks. One module per assignment (``assign_*.py``) defines its ``ASSIGNMENT``, and the
table here names them all, the way mosaicml/streaming names its shuffle algorithms.
"""

from __future__ import annotations

from ..errors import ConfigError
from .stream import Assignment, Explicit, Identity, Stream

#: Every assignment, by name: the module whose ``ASSIGNMENT`` defines it. One table,
#: read lazily; the modules import only :mod:`feedline.plan.stream`, never this one.
ASSIGNMENT_MODULES: dict[str, str] = {
    "chunk": "feedline.plan.assign_chunk",
    "contiguous": "feedline.plan.assign_contiguous",
    "global": "feedline.plan.assign_global",
    "memory": "feedline.plan.assign_memory",
    "skip": "feedline.plan.assign_skip",
    "strided": "feedline.plan.assign_strided",
    "window": "feedline.plan.assign_window",
}


def get_assignment(name: str) -> Assignment:
    """The assignment *name* (:data:`ASSIGNMENT_MODULES`)."""
    import importlib

    try:
        module = ASSIGNMENT_MODULES[name]
    except KeyError:
        raise ConfigError(
            f"unknown assignment {name!r}; known: {sorted(ASSIGNMENT_MODULES)}"
        ) from None
    a: Assignment = importlib.import_module(module).ASSIGNMENT
    return a


__all__ = ["ASSIGNMENT_MODULES", "Assignment", "Explicit", "Identity", "Stream", "get_assignment"]
