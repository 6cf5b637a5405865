# SPDX-License-Identifier: Apache-2.0
"""The Loader's machinery: options, the reader of extents, the epoch runner and its
passes, the resume state, the Loader's world. How bytes arrive is :mod:`feedline.sources`.
"""

from .options import BufferSize, PipelineOptions

__all__ = ["BufferSize", "PipelineOptions"]
