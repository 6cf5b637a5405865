# SPDX-License-Identifier: Apache-2.0
"""feedline's tools: benchmarks, the demo, dataset generators and the storage emulator's
driver, reached through the same ``feedline`` command (``feedline bench``, ``feedline
demo``, ``feedline make``, ``feedline emulate``).

They live beside the library, not in it: a training job imports ``feedline`` (the loader
and what it needs) and never loads this package. Installed by the same ``pip install``.
"""
