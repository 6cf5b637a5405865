"""``contiguous``: MPI-Caffe's improved pattern. Rank r owns one contiguous region of the
records, sized to exactly what it consumes in the epoch, and reads it front to back, so
read-ahead and client caches work. Depends on P by definition."""

from __future__ import annotations

from .streams import Assignment, Identity, register

ASSIGNMENT = register(
    Assignment(
        name="contiguous",
        make=lambda n, strategy, key: Identity(n),
        layout=lambda strategy: "rank",
        world_independent=lambda strategy: False,
    )
)
