"""Which rank am I, of how many, on which node: the Loader's view of the job.

Resolution order (DESIGN.md, "Launchers"): an explicit mpi4py communicator; else
``MPI.COMM_WORLD`` when ``mpiexec``/``srun`` started several processes; else one
process. A job started by ``torchrun`` (``WORLD_SIZE`` > 1 without an MPI launcher) is
refused here with a message — :mod:`feedline.torch` builds a world from
torch.distributed instead — so no rank ever silently reads the whole dataset. Node
discovery and windows belong to :mod:`feedline.dist`; this module only asks it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..plan.world import WorldSpec

_MPI_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS")


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
    comm : mpi4py communicator or None
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

    def close(self) -> None:
        """Release the MPI World's resources (windows); the communicator stays the user's."""
        if self.dist is not None and hasattr(self.dist, "close"):
            with contextlib.suppress(Exception):  # pragma: no cover - MPI already finalized at exit
                self.dist.close()
            self.dist = None


def launched_by_mpi() -> int:
    """World size announced by an MPI launcher's environment (0 when none)."""
    for var in _MPI_SIZE_VARS[:3]:
        v = os.environ.get(var)
        if v and v.isdigit():
            return int(v)
    return 0


def torch_env_world() -> tuple[int, int, int] | None:
    """``(rank, world_size, local_world_size)`` from torchrun's environment, or None."""
    try:
        size = int(os.environ.get("WORLD_SIZE", ""))
        rank = int(os.environ.get("RANK", ""))
    except ValueError:
        return None
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0) or size
    return rank, size, local


def resolve_world(comm: Any, nodes: int = 0) -> LoaderWorld:
    """The world for *comm* (None: detect the launcher); *nodes* > 0 emulates nodes."""
    if isinstance(comm, LoaderWorld):
        return comm
    if comm is None:
        if launched_by_mpi() > 1:
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
        else:
            tw = torch_env_world()
            if tw is not None and tw[1] > 1:
                raise ConfigError(
                    f"started by torchrun (WORLD_SIZE={tw[1]}) without MPI: use feedline.torch "
                    "(it builds the world from torch.distributed), pass comm=, or launch with "
                    "mpiexec; feedline will not read the whole dataset on every rank"
                )
            return LoaderWorld(0, 1, 1)
    rank, size = int(comm.Get_rank()), int(comm.Get_size())
    if nodes:
        if nodes > size:
            raise ConfigError(f"nodes={nodes} exceeds the {size} ranks (FEEDLINE_NODES)")
        return LoaderWorld(
            rank, size, nodes, emulated=True, comm=comm, dist=_dist(comm, nodes), launcher="mpi"
        )
    dist = _dist(comm, 0)
    m = int(getattr(dist, "nodes", 0) or 0) if dist is not None else _count_nodes(comm)
    return LoaderWorld(rank, size, max(1, min(m, size)), comm=comm, dist=dist, launcher="mpi")


def _dist(comm: Any, nodes: int) -> Any:
    """The dist World, when that layer is available (None otherwise)."""
    try:
        from ..dist.world import World
    except ImportError:
        return None
    return World.from_comm(comm, nodes=nodes or None, alarm=True)


def _count_nodes(comm: Any) -> int:
    """Nodes of *comm* by shared-memory split (fallback while dist has no World)."""
    from mpi4py import MPI

    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        leader = 1 if local.Get_rank() == 0 else 0
    finally:
        local.Free()
    return int(comm.allreduce(leader))
