# SPDX-License-Identifier: Apache-2.0
"""The Loader's machinery: options, sources (how bytes arrive), the epoch runner, state.

Sources are registered by name (:data:`SOURCES`); presets map to sources in
:data:`PRESET_SOURCES`. See :mod:`feedline.pipeline.source` for the protocol.
"""

from .options import BufferSize, PipelineOptions
from .source import (
    PRESET_SOURCES,
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
    "BufferSize",
    "PipelineOptions",
    "RawBatch",
    "Source",
    "SourceContext",
    "SourceStopped",
    "register_source",
]
