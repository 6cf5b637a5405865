# SPDX-License-Identifier: Apache-2.0
"""Storage profiles for the cost model (docs/planner.md, "Storage profiles"): what the
model knows of the storage, the documented defaults by file system type, and how a
profile is resolved (given, an emulator mount's own, a saved probe, the type's default).
``feedline.plan.cost`` re-exports every name."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..errors import ConfigError


@dataclass(frozen=True)
class StorageProfile:
    """What the cost model knows of the storage (bandwidths in bytes/s).

    ``aggregate_bw`` 0 means node-local storage (scales with the nodes);
    ``server_streams`` 0 means no contention modelled.
    """

    name: str
    latency_s: float
    stream_bw: float
    node_bw: float
    aggregate_bw: float
    streams_per_node: int
    server_streams: int = 0
    seek_s: float = 0.0  # paid by a request that does not continue the previous one
    #: what more than ``server_streams`` concurrent streams do: ``collapse`` — the
    #: aggregate bandwidth falls in proportion (seek thrashing and lock traffic of a real
    #: parallel file system under many clients); ``queue`` — requests wait for a free
    #: server slot and the throughput holds (the storage emulator's servers), so only
    #: the slots' seek time is charged
    contention: str = "collapse"
    #: CPU seconds the storage costs the reading host per byte read, beyond the reader's
    #: own (a storage daemon on the same host, like the storage emulator's: its copies)
    host_cpu_per_byte: float = 0.0
    shared_cache: str = "node"
    fs_type: str = ""
    source: str = "default"
    notes: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StorageProfile:
        names = {f.name for f in dataclasses.fields(cls)}
        missing = {"name", "latency_s", "stream_bw", "node_bw", "aggregate_bw", "streams_per_node"}
        missing -= set(d)
        if missing:
            raise ConfigError(f"storage profile lacks {sorted(missing)}")
        return cls(**{k: v for k, v in d.items() if k in names})


#: documented defaults (docs/planner.md, "Storage profiles")
PROFILES: dict[str, StorageProfile] = {
    # a mid-size Lustre/GPFS: ~2 ms per request under load (RPC + server queue + seek),
    # 1 GB/s per stream, a 100 Gb/s client link, 100 GB/s for the job, contention beyond
    # ~1,024 concurrent streams
    "parallel": StorageProfile(
        "parallel",
        2e-3,
        1.0e9,
        10e9,
        100e9,
        8,
        1024,
        source="default for Lustre, GPFS, BeeGFS, NFS, FUSE",
    ),
    # a node-local SSD
    "local": StorageProfile(
        "local", 1e-4, 2.0e9, 3.0e9, 0.0, 4, 0, source="default for ext4, xfs, btrfs"
    ),
    # tmpfs / page cache
    "memory": StorageProfile("memory", 5e-6, 5e9, 10e9, 0.0, 2, 0, source="default for tmpfs"),
}

#: file system type -> default profile
FS_PROFILES = {
    "lustre": "parallel",
    "gpfs": "parallel",
    "beegfs": "parallel",
    "nfs": "parallel",
    "fuse": "parallel",
    "ext4": "local",
    "xfs": "local",
    "btrfs": "local",
    "overlay": "local",
    "tmpfs": "memory",
}
_FS_MAGIC = {
    0x0BD00BD0: "lustre",
    0x47504653: "gpfs",
    0x19830326: "beegfs",
    0x6969: "nfs",
    0x65735546: "fuse",
    0xEF53: "ext4",
    0x58465342: "xfs",
    0x9123683E: "btrfs",
    0x794C7630: "overlay",
    0x01021994: "tmpfs",
}


@lru_cache(maxsize=256)
def fs_type(path: str) -> str:
    """The file system type of *path* from ``statfs``'s magic ("" when unknown)."""
    import ctypes
    import ctypes.util

    class _Statfs(ctypes.Structure):
        _fields_ = [("f_type", ctypes.c_long), ("_rest", ctypes.c_byte * 120)]

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        buf = _Statfs()
        if libc.statfs(os.fsencode(path), ctypes.byref(buf)) != 0:
            return ""
    except (OSError, AttributeError):  # pragma: no cover - non-Linux
        return ""
    return _FS_MAGIC.get(buf.f_type & 0xFFFFFFFF, "")


def get_profile(
    profile: StorageProfile | str | dict | None = None, path: str | None = None
) -> StorageProfile:
    """Resolve a profile: an object, a name of :data:`PROFILES`, a dict, a saved probe of
    *path*'s file system, or the default for *path*'s file system type ("parallel" when
    nothing is known: the cluster is what the default must be right for)."""
    if isinstance(profile, StorageProfile):
        return profile
    if isinstance(profile, dict):
        return StorageProfile.from_dict(profile)
    if isinstance(profile, str) and profile not in ("", "auto"):
        if profile in PROFILES:
            return PROFILES[profile]
        if os.path.exists(profile):
            import json

            with open(profile) as f:
                return StorageProfile.from_dict(json.load(f))
        raise ConfigError(
            f"unknown storage profile {profile!r}: give one of {sorted(PROFILES)}, a JSON "
            "file written by `feedline probe --json`, or leave it unset"
        )
    if path:
        saved = _saved_profile(path)
        if saved is not None:
            return saved
        kind = FS_PROFILES.get(fs_type(path))
        if kind:
            p = PROFILES[kind]
            return dataclasses.replace(p, fs_type=fs_type(path))
    return PROFILES["parallel"]


def _saved_profile(path: str) -> StorageProfile | None:
    from ..io.profiles import load_saved_profile

    try:
        d = load_saved_profile(path)
        return StorageProfile.from_dict(d) if d else None
    except (ConfigError, TypeError):  # a damaged cache entry must not stop a training job
        return None
