# SPDX-License-Identifier: Apache-2.0
"""Which rank am I, of how many, on which node: the Loader's view of the job.

Resolution order (docs/getting-started.md, "Under mpiexec and srun"): an explicit MPI
communicator; else ``MPI.COMM_WORLD`` when the launcher — read by
:func:`feedline.dist.launch.detect`, the one detector — is ``mpiexec``/``mpirun``/a PMIx
launcher or an ``srun`` step that started several processes (checked: when MPI sees one
process of several, :class:`~feedline.dist.launch.LaunchMismatchError`); else one
process, without starting MPI. A job started by ``torchrun`` (or any
torch.distributed environment, ``WORLD_SIZE`` > 1, without an MPI launcher) is refused
here with a message — :mod:`feedline.torch` builds a world from torch.distributed
instead — so no rank ever silently reads the whole dataset. Node discovery and windows
belong to :mod:`feedline.dist`; this module only asks it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from ..dist.launch import detect, job_comm, torch_launch
from ..errors import ConfigError
from ..plan.world import WorldSpec


@dataclass
class LoaderWorld:
    """This process's place in the job.

    Attributes
    ----------
    rank, size : int
    nodes : int
        Nodes (real, or emulated with ``nodes=`` / ``FEEDLINE_NODES``).
    emulated : bool
        Nodes are emulated (``node = rank * nodes // size``).
    comm : MPI communicator (``MPI.Comm``) or None
    dist : feedline.dist.world.World or None
        The MPI World (node windows, tokens) when available.
    launcher : str
        ``single``, ``mpi`` or ``torch``.
    """

    rank: int
    size: int
    nodes: int = 1
    emulated: bool = False
    comm: Any = None
    dist: Any = None
    launcher: str = "single"

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ConfigError(f"rank {self.rank} outside world of {self.size}")
        self.spec = WorldSpec(self.size, self.nodes)

    @property
    def node(self) -> int:
        return self.spec.node_of(self.rank)

    @property
    def ranks_per_node(self) -> int:
        return len(self.spec.ranks_of(self.node))

    @property
    def host(self) -> tuple[int, int]:
        """``(ranks, cores)`` of this host: the job's ranks that share its cores (its
        shared-memory domain, whatever nodes are emulated) and the cores they may run
        on (the cost model's ``cpu`` term)."""
        if self.dist is not None and hasattr(self.dist, "host_ranks"):
            return int(self.dist.host_ranks), int(self.dist.host_cores)
        import os

        from .options import _cpus

        cores = _cpus()
        # without MPI (one process, or torch.distributed): a node's ranks share a host;
        # each may be bound to cores of its own (a launcher's per-task binding)
        ranks = self.ranks_per_node if self.size > 1 else 1
        return ranks, max(1, cores, min(os.cpu_count() or 1, cores * ranks))

    def close(self) -> None:
        """Release the MPI World's resources (windows); the communicator stays the user's."""
        if self.dist is not None and hasattr(self.dist, "close"):
            with contextlib.suppress(Exception):  # pragma: no cover - MPI already finalized at exit
                self.dist.close()
            self.dist = None


def launched_by_mpi() -> int:
    """World size announced by an MPI launcher's PMI/PMIx variables (``mpiexec``,
    ``mpirun``, ``srun --mpi=pmi2|pmix``), 0 when there are none or they give no size.

    An srun step without PMI variables and torchrun do not count here (see
    :func:`feedline.dist.launch.detect` for the whole rule): :mod:`feedline.torch` builds
    its world from the torch.distributed variables unless this is above 1.
    """
    launch = detect()
    return (launch.size or 0) if launch.by_mpi else 0


def torch_env_world() -> tuple[int, int, int] | None:
    """``(rank, world_size, local_world_size)`` from the torch.distributed variables
    (``RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``; set by torchrun, or by a script
    under srun), or None when they are not all there."""
    tl = torch_launch()
    if tl is None or tl.rank is None or tl.size is None:
        return None
    return tl.rank, tl.size, tl.local_size or tl.size


def resolve_world(comm: Any, nodes: int = 0) -> LoaderWorld:
    """The world for *comm* (None: detect the launcher); *nodes* > 0 emulates nodes.

    Raises
    ------
    ConfigError
        torchrun (torch.distributed variables, several processes) without MPI, or a
        multi-process launch without the MPI package.
    LaunchMismatchError
        The launcher started several processes but MPI sees one (a ``ConfigError``).
    """
    if isinstance(comm, LoaderWorld):
        return comm
    if comm is None:
        comm = job_comm(
            "use feedline.torch (it builds the world from torch.distributed), pass comm=, "
            "or launch with mpiexec; feedline will not read the whole dataset on every rank"
        )
        if comm is None:
            return LoaderWorld(0, 1, 1)
    rank, size = int(comm.Get_rank()), int(comm.Get_size())
    if nodes:
        if nodes > size:
            raise ConfigError(f"nodes={nodes} exceeds the {size} ranks (FEEDLINE_NODES)")
        return LoaderWorld(
            rank, size, nodes, emulated=True, comm=comm, dist=_dist(comm, nodes), launcher="mpi"
        )
    dist = _dist(comm, 0)
    m = int(dist.nodes)
    return LoaderWorld(rank, size, max(1, min(m, size)), comm=comm, dist=dist, launcher="mpi")


def _dist(comm: Any, nodes: int) -> Any:
    """The dist World of *comm* (its nodes: emulated, or by shared-memory split)."""
    from ..dist.world import World

    return World.from_comm(comm, nodes=nodes or None, alarm=True)
