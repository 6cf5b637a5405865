# SPDX-License-Identifier: Apache-2.0
"""Parameters of the storage emulator's model, their defaults and the config file.

The defaults resemble the papers' GPFS/Lustre/BeeGFS setups scaled to one machine: a
few hundred µs per request, ~1 GB/s per client node, ~2 GB/s for the whole system,
1 MiB stripes over 4 servers, a millisecond seek penalty and 4 concurrent requests per
server. ``docs/emulator.md`` explains each one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from dataclasses import dataclass
from typing import Any

from feedline.errors import ConfigError


@dataclass(frozen=True, slots=True)
class EmulatorParams:
    """The modelled storage (see ``docs/emulator.md``).

    Parameters
    ----------
    latency_us : float
        Fixed cost of every request (RPC round trip and server software), µs.
    node_mbps : float
        Bandwidth of each emulated node's link, MB/s (1 MB = 1e6 bytes).
    aggregate_mbps : float
        Bandwidth shared by all nodes (network backbone), MB/s.
    server_mbps : float
        Media bandwidth of each storage server, MB/s.
    servers : int
        Storage servers (Lustre OSTs, GPFS NSD servers, BeeGFS targets).
    stripe_count : int
        Servers a file is striped over; 0 means all of them.
    stripe_kib : int
        Stripe size, KiB.
    seek_us : float
        Paid by each stripe chunk that does not continue the previous request of that
        file at that server (disk-backed servers), µs.
    server_concurrency : int
        Requests a server serves at once; more queue.
    burst_kib : int
        Token-bucket depth of the node and aggregate links, KiB (0: a strict pipe).
    readahead_kib : int
        Client read-ahead of every node view, KiB (0: the kernel's default, 128 KiB).
    max_request_kib : int
        Largest read request the kernel sends, KiB (at most 1024).
    log_requests : int
        Recent requests kept in the per-request log (0: totals only).
    max_threads : int
        FUSE worker threads; each in-flight request holds one while it sleeps.
    path_us : float
        The kernel path between a reader and the daemon, µs, counted inside
        ``latency_us`` (the daemon replies that much earlier); negative: measured at
        start-up (median round trip of an empty read), capped at half the latency.
    """

    latency_us: float = 300.0
    node_mbps: float = 1000.0
    aggregate_mbps: float = 2000.0
    server_mbps: float = 800.0
    servers: int = 4
    stripe_count: int = 0
    stripe_kib: int = 1024
    seek_us: float = 1000.0
    server_concurrency: int = 4
    burst_kib: int = 0
    readahead_kib: int = 1024
    max_request_kib: int = 1024
    log_requests: int = 65536
    max_threads: int = 128
    path_us: float = -1.0

    def __post_init__(self) -> None:
        checks = [
            ("latency_us", self.latency_us >= 0),
            ("node_mbps", self.node_mbps > 0),
            ("aggregate_mbps", self.aggregate_mbps > 0),
            ("server_mbps", self.server_mbps > 0),
            ("servers", 1 <= self.servers <= 4096),
            ("stripe_count", 0 <= self.stripe_count <= 4096),
            ("stripe_kib", self.stripe_kib >= 4 and self.stripe_kib % 4 == 0),
            ("seek_us", self.seek_us >= 0),
            ("server_concurrency", 1 <= self.server_concurrency <= 4096),
            ("burst_kib", self.burst_kib >= 0),
            ("readahead_kib", self.readahead_kib >= 0),
            ("max_request_kib", 4 <= self.max_request_kib <= 1024),
            ("log_requests", self.log_requests >= 0),
            ("max_threads", 2 <= self.max_threads <= 4096),
        ]
        for name, ok in checks:
            if not ok:
                raise ConfigError(
                    f"emulator parameter {name}={getattr(self, name)!r} is out of range"
                )

    @classmethod
    def names(cls) -> list[str]:
        """Parameter names, in declaration order."""
        return [f.name for f in dataclasses.fields(cls)]

    def replace(self, **changes: Any) -> EmulatorParams:
        """A copy with *changes*; unknown names and bad values raise ConfigError."""
        unknown = sorted(set(changes) - set(self.names()))
        if unknown:
            raise ConfigError(f"unknown emulator parameter(s) {unknown}; known: {self.names()}")
        typed = {}
        for f in dataclasses.fields(self):
            if f.name in changes:
                kind: type[Any] = type(f.default)
                try:
                    typed[f.name] = kind(changes[f.name])
                except (TypeError, ValueError):
                    raise ConfigError(
                        f"emulator parameter {f.name}={changes[f.name]!r} is not a {kind.__name__}"
                    ) from None
                if kind is int and typed[f.name] != changes[f.name]:
                    raise ConfigError(f"emulator parameter {f.name} must be an integer")
        return dataclasses.replace(self, **typed)

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], base: EmulatorParams | None = None
    ) -> EmulatorParams:
        """Read a TOML or JSON config file (by extension; anything else is tried as TOML).

        Keys are parameter names (``latency_us`` or ``latency-us``), at the top level or
        in an ``[emulator]`` table; ``nodes`` is ignored here (it is not a storage
        parameter).
        """
        path = os.fspath(path)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as e:
            raise ConfigError(f"cannot read emulator config {path}: {e.strerror}") from None
        try:
            data = json.loads(raw) if path.endswith(".json") else tomllib.loads(raw.decode())
        except (ValueError, UnicodeDecodeError) as e:
            raise ConfigError(
                f"{path}: not valid {'JSON' if path.endswith('.json') else 'TOML'}: {e}"
            ) from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a table of parameters")
        if isinstance(data.get("emulator"), dict):
            data = data["emulator"]
        changes = {str(k).replace("-", "_"): v for k, v in data.items() if k != "nodes"}
        return (base or cls()).replace(**changes)

    def argv(self) -> list[str]:
        """Command-line options of ``feedline-fuse`` for these parameters."""
        out = []
        for f in dataclasses.fields(self):
            out += ["--" + f.name.replace("_", "-"), repr(getattr(self, f.name))]
        return out

    def as_dict(self) -> dict[str, Any]:
        """The parameters as a plain dict."""
        return dataclasses.asdict(self)
