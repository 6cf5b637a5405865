# SPDX-License-Identifier: Apache-2.0
"""Sources: what brings one rank's raw records for each step (the protocol and the
registry in :mod:`feedline.sources.base`; every source feedline ships is named in
:data:`~feedline.sources.base.SOURCE_MODULES`, and :mod:`feedline.testing` checks any
source against the protocol).

========  ==================================================================
direct    each rank reads its own coalesced windows (``feedline``, ``tf*``)
grouped   an I/O thread fills 1 or 2 group buffers (the async-I/O paper)
node      k readers per node fill a double-buffered node window (MPI)
store     DeepIO's in-memory store, ordered or opportunistic (MPI RMA)
lmdbio    the LMDBIO / MPI-Caffe readers, step by step
========  ==================================================================
"""

from .base import (
    PRESET_SOURCES,
    SOURCE_MODULES,
    SOURCES,
    RawBatch,
    Source,
    SourceContext,
    SourceStopped,
    register_source,
)

__all__ = [
    "PRESET_SOURCES",
    "SOURCES",
    "SOURCE_MODULES",
    "RawBatch",
    "Source",
    "SourceContext",
    "SourceStopped",
    "register_source",
]
