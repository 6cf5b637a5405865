# SPDX-License-Identifier: Apache-2.0
"""Where storage profiles are kept: the profile a ``feedline emulate`` mount reports, and
the profiles ``feedline probe`` saved per file system (under the cache dir). Read by the
planner's cost model (:func:`feedline.plan.cost.get_profile`) and written by the probe;
it needs neither."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any

from .. import defaults

EMULATOR_STATS = ".feedline-stats"


# --------------------------------------------------------------- mount points


def _mount_lines() -> list[list[str]]:
    """``/proc/self/mounts`` split into fields (empty when unreadable)."""
    try:
        with open("/proc/self/mounts") as f:
            return [line.split() for line in f.read().splitlines()]
    except OSError:
        return []


def mount_of(path: str, fs_prefix: str = "") -> tuple[str, str] | None:
    """The (mount point, file system type) that holds *path* (``/proc/self/mounts``,
    longest prefix); with *fs_prefix*, only mounts whose type starts with it."""
    real = os.path.realpath(path)
    best: tuple[str, str] | None = None
    for parts in _mount_lines():
        if len(parts) < 3 or not parts[2].startswith(fs_prefix):
            continue
        mnt = parts[1].replace("\\040", " ")
        if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and (
            best is None or len(mnt) > len(best[0])
        ):
            best = (mnt, parts[2])
    return best


def mount_options(mount_point: str) -> tuple[str, ...]:
    """The options of the mount at *mount_point* (the first listed; empty if none)."""
    for parts in _mount_lines():
        if len(parts) > 3 and parts[1] == mount_point:
            return tuple(parts[3].split(","))
    return ()


def emulator_stats(path: str) -> dict[str, Any] | None:
    """The storage emulator's statistics document if *path* is on one of its mounts."""
    m = mount_of(path, "fuse")
    return None if m is None else _read_stats(m[0])


def _read_stats(mount: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(mount, EMULATOR_STATS)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


#: emulator profiles already read, by (mount point, device number, the daemon's start
#: time, which the mount gives its statistics file): a mount's parameters are fixed for
#: its life, and reading them through FUSE costs milliseconds at every Loader
_EMULATOR_PROFILES: dict[tuple[str, int, int], dict[str, Any] | None] = {}


def emulator_profile(path: str) -> dict[str, Any] | None:
    """The profile a storage emulator mount reports from its own parameters."""
    m = mount_of(path, "fuse")
    if m is None:
        return None
    try:
        st = os.stat(os.path.join(m[0], EMULATOR_STATS))
    except OSError:
        return None
    key = (m[0], st.st_dev, st.st_mtime_ns)
    if st.st_mtime_ns == 0:  # a daemon that does not say when it started: read each time
        return _emulator_profile(_read_stats(m[0]))
    if key not in _EMULATOR_PROFILES:
        _EMULATOR_PROFILES[key] = _emulator_profile(_read_stats(m[0]))
    prof = _EMULATOR_PROFILES[key]
    return dict(prof) if prof is not None else None


#: CPU seconds the emulator's daemon spends per byte it serves (a read of its source
#: file and a reply through /dev/fuse): 0.45-0.5 s per 825 MB epoch in 1 MiB requests on
#: this 2-core VM (docs/planner.md, eleventh session)
EMULATOR_CPU_PER_BYTE = 0.6e-9


def _emulator_profile(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    if not doc or "params" not in doc:
        return None
    p = doc["params"]
    per_server = float(p["server_mbps"]) * 1e6
    return {
        "name": "emulator",
        "latency_s": float(p["latency_us"]) * 1e-6,
        # one stream: bounded by its node link and by the server its request lands on
        "stream_bw": min(float(p["node_mbps"]) * 1e6, per_server),
        "node_bw": float(p["node_mbps"]) * 1e6,
        "aggregate_bw": min(float(p["aggregate_mbps"]) * 1e6, per_server * int(p["servers"])),
        "streams_per_node": int(p["server_concurrency"]) * int(p["servers"]),
        "server_streams": int(p["server_concurrency"]) * int(p["servers"]),
        "seek_s": float(p.get("seek_us", 0.0)) * 1e-6,
        # its servers queue requests beyond their slots without losing throughput
        "contention": "queue",
        # its daemon runs on the reading host: its copies take that host's cores
        "host_cpu_per_byte": EMULATOR_CPU_PER_BYTE,
        "shared_cache": "view",
        "fs_type": "fuse",
        "source": f"storage emulator at {doc.get('mountpoint')} (its parameters)",
        "notes": f"{doc.get('nodes')} node views, read-ahead {p.get('readahead_kib')} KiB",
    }


# --------------------------------------------------------------- the cache


def _cache_file(path: str) -> str:
    m = mount_of(path) or ("/", "")
    key = hashlib.blake2b(f"{m[0]}\0{m[1]}".encode(), digest_size=8).hexdigest()
    name = (m[1] or "fs").replace("/", "_")
    return os.path.join(str(defaults.get("cache_dir")), "profiles", f"{name}-{key}.json")


def load_saved_profile(path: str) -> dict[str, Any] | None:
    """The profile of *path*'s file system: the emulator's own, else a saved probe."""
    emu = emulator_profile(path)
    if emu is not None:
        return emu
    try:
        with open(_cache_file(path)) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def save_profile(path: str, profile: dict[str, Any]) -> str:
    """Save *profile* for *path*'s file system (atomically); return the file written."""
    out = _cache_file(path)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(out), prefix=".profile-")
    with os.fdopen(fd, "w") as f:
        json.dump(profile, f, indent=1)
    os.replace(tmp, out)
    return out
