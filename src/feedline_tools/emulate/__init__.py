# SPDX-License-Identifier: Apache-2.0
"""Storage emulator: one machine behaves like a small cluster on a parallel file system.

A FUSE daemon (``feedline-fuse``, C++ on libfuse3) mounts ``MNT/node0`` ...
``MNT/node{M-1}``, read-only views of one source directory. Each view has its own inode
numbers, so the kernel keeps a separate page cache per emulated node, and two opens on
one node share it (``keep_cache``). Every read request that reaches the daemon is
charged by a model — per-request latency, per-node and aggregate token buckets, files
striped over servers of bounded concurrency, a seek penalty for non-sequential chunks —
and answered at its modelled completion time (the worker sleeps until the deadline, so
wall time follows the model without burning CPU). The trade-off: one daemon and one
FUSE connection for all nodes keeps the model's shared resources (servers, backbone)
in one process, but the views share the connection's request queue and worker threads.

See ``docs/emulator.md``.
"""

from feedline_tools.emulate.mount import (
    Emulator,
    EmulatorUnavailable,
    check_available,
    find_binary,
    is_mounted,
    mount_root,
    unmount,
)
from feedline_tools.emulate.params import EmulatorParams

__all__ = [
    "Emulator",
    "EmulatorParams",
    "EmulatorUnavailable",
    "check_available",
    "find_binary",
    "is_mounted",
    "mount_root",
    "unmount",
]
