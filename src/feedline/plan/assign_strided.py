# SPDX-License-Identifier: Apache-2.0
"""``strided``: the identity order (Caffe/LMDB). Step s takes records [s·B, (s+1)·B) and
rank r the r-th contiguous sub-batch; sequential in the file, no randomness at all."""

from __future__ import annotations

from .stream import Assignment, Identity

ASSIGNMENT = Assignment(
    name="strided",
    make=lambda n, strategy, key: Identity(n),
    layout=lambda strategy: "row",
    world_independent=lambda strategy: True,
)
