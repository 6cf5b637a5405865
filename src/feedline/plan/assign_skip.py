# SPDX-License-Identifier: Apache-2.0
"""``skip``: MPI-Caffe's original pattern. Step s covers the same records as ``strided``
but rank r takes records s·B + r, s·B + r + P, ... — read one, skip P-1 — so every rank
passes over the whole file. Depends on P by definition."""

from __future__ import annotations

from .stream import Assignment, Identity

ASSIGNMENT = Assignment(
    name="skip",
    make=lambda n, strategy, key: Identity(n),
    layout=lambda strategy: "skip",
    world_independent=lambda strategy: False,
)
