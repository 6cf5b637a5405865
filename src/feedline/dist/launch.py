# SPDX-License-Identifier: Apache-2.0
"""Who started this process: the one launcher detector of feedline.

:func:`detect` reads the launcher variables once, in one place, and every part of
feedline that asks "am I one of several processes?" goes through it: the Loader's world
(:mod:`feedline.pipeline.world`), :meth:`feedline.dist.World.from_comm`, the progress
bars' rank (:mod:`feedline.progress`), the torch adapter and the benchmarks. It only
reads the environment; mpi4py is imported by :func:`launcher_comm`, and only when the
launch asks for MPI.

The rule, in order (the first that matches wins):

1. **torchrun itself** (``TORCHELASTIC_RUN_ID`` or ``GROUP_RANK`` set, and
   ``WORLD_SIZE`` a number): kind ``"torchrun"``. torchrun is then this process's parent, so its
   ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` win over MPI or Slurm
   variables inherited from whatever started torchrun (``srun ... torchrun ...``).
2. **An MPI launcher**, by its process-manager variables: Open MPI's
   ``OMPI_COMM_WORLD_RANK``/``SIZE``/``LOCAL_RANK``/``LOCAL_SIZE`` (kind ``"openmpi"``);
   PMI-1/PMI-2 ``PMI_RANK``/``PMI_SIZE`` with Hydra's ``MPI_LOCALRANKID``/
   ``MPI_LOCALNRANKS`` (kind ``"hydra"``: MPICH's and Intel MPI's ``mpiexec``, and also
   ``srun --mpi=pmi2``); ``PMIX_RANK`` (and ``PMIX_SIZE`` when set; kind ``"pmix"``:
   ``srun --mpi=pmix``, PRRTE). A field these variables leave unknown is taken from the
   Slurm step when its numbering agrees (``srun --mpi=pmix`` sets ``PMIX_RANK`` but no
   size).
3. **An srun step** (kind ``"slurm"``): ``SLURM_PROCID`` is set *and* ``SLURM_STEP_ID``
   (or ``SLURM_STEPID``) holds a job step number. Slurm sets ``SLURM_STEP_ID`` only in the
   tasks of a step launched by ``srun``; the batch script of ``sbatch`` (task 0 of the
   batch step: ``SLURM_PROCID=0``, no step id), the shell of ``salloc`` (no
   ``SLURM_PROCID``) and salloc's interactive step run *one* process even though
   ``SLURM_NTASKS`` says how many tasks the allocation holds, so they are not a
   multi-process launch. ``SLURM_PROCID > 0`` without a step id is taken as a step too
   (the batch shell is always task 0). Size: ``SLURM_STEP_NUM_TASKS``, else
   ``SLURM_NTASKS``/``SLURM_NPROCS``; local size: this node's entry of
   ``SLURM_STEP_TASKS_PER_NODE``/``SLURM_TASKS_PER_NODE`` (``"4(x2),3"``: 4, 4, 3) at
   ``SLURM_NODEID``, else ``SLURM_NTASKS_PER_NODE``; local rank: ``SLURM_LOCALID``.
4. **The torch.distributed environment** without torchrun's markers (``WORLD_SIZE`` a
   number, e.g. ``torch.distributed.launch``, DeepSpeed, or a script that exported them):
   kind ``"torchrun"``, below MPI and Slurm because a process started by ``mpiexec`` or
   ``srun`` may export these variables for torch.distributed itself.
5. Otherwise kind ``"none"``: one process, rank 0 of 1.

What feedline does with it: :attr:`Launch.mpi_world` (an MPI launcher or an srun step
that started several processes, or did not say how many) means ``MPI.COMM_WORLD``,
checked by :func:`launcher_comm` — when the launcher started N > 1 processes but MPI
sees one (``srun`` without a PMI plugin MPI understands, or an ``mpiexec`` from another
MPI than mpi4py's), :class:`LaunchMismatchError` says so instead of letting every rank
read the whole dataset. A multi-process ``"torchrun"`` launch without MPI is refused by
the Loader (:mod:`feedline.torch` builds its world from torch.distributed instead). One
process: a 1-rank world, and mpi4py is not imported.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

__all__ = [
    "KINDS",
    "MPI_KINDS",
    "Launch",
    "LaunchMismatchError",
    "check_mpi_size",
    "detect",
    "launcher_comm",
    "rank_from_env",
    "torch_launch",
]

#: Every value of :attr:`Launch.kind`.
KINDS = ("hydra", "openmpi", "pmix", "slurm", "torchrun", "none")
#: Kinds whose variables come from an MPI process manager (PMI/PMIx).
MPI_KINDS = ("hydra", "openmpi", "pmix")

# Slurm's special step ids (batch, extern, interactive, ...) are the top of the uint32
# range; a value there, or a word, is not a step srun launched.
_SLURM_SPECIAL_STEP = 0xFFFFFFF0

_NAMES = {
    "hydra": "mpiexec/PMI",
    "openmpi": "Open MPI's mpirun",
    "pmix": "a PMIx launcher",
    "slurm": "srun",
    "torchrun": "torchrun",
    "none": "no launcher",
}


class LaunchMismatchError(ConfigError):
    """The launcher started several processes but MPI sees one: the MPI library did not
    get the launcher's process information (see :func:`check_mpi_size`)."""


@dataclass(frozen=True)
class Launch:
    """What started this process, from the launcher's environment (:func:`detect`).

    Attributes
    ----------
    kind : str
        ``"hydra"``, ``"openmpi"``, ``"pmix"``, ``"slurm"``, ``"torchrun"`` or
        ``"none"`` (see the module docstring for the rule).
    rank, size : int or None
        This process's global rank and the number of processes the launcher started;
        None when the launcher's variables do not say (``PMIX_RANK`` without a size, a
        half-set environment). ``"none"``: 0 and 1.
    local_rank, local_size : int or None
        The same on this node; None when unknown.
    source : str
        The variables read, ``NAME=value`` separated by spaces (for messages).
    """

    kind: str
    rank: int | None
    size: int | None
    local_rank: int | None = None
    local_size: int | None = None
    source: str = ""

    @property
    def by_mpi(self) -> bool:
        """An MPI process manager (PMI/PMIx variables) started this process."""
        return self.kind in MPI_KINDS

    @property
    def multi_process(self) -> bool:
        """The launcher started more than one process, or (size None) did not say how
        many. False only for a launch of one process and for ``"none"``."""
        return self.size is None or self.size > 1

    @property
    def mpi_world(self) -> bool:
        """The processes should form an MPI world: a multi-process launch by an MPI
        launcher or by srun. False for one process and for torchrun."""
        return self.kind in (*MPI_KINDS, "slurm") and self.multi_process

    def describe(self) -> str:
        """``srun (SLURM_PROCID=2 SLURM_STEP_NUM_TASKS=4)``: for messages."""
        name = _NAMES.get(self.kind, self.kind)
        return f"{name} ({self.source})" if self.source else name


def _int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None:
        return None
    raw = raw.strip()
    return int(raw) if raw.isascii() and raw.isdigit() else None


def _first(env: Mapping[str, str], *names: str) -> tuple[int | None, str | None]:
    """The first of *names* set to a non-negative integer, and its name."""
    for n in names:
        v = _int(env, n)
        if v is not None:
            return v, n
    return None, None


def _source(env: Mapping[str, str], names: list[str | None]) -> str:
    seen: list[str] = []
    for n in names:
        if n and n in env and n not in seen:
            seen.append(n)
    return " ".join(f"{n}={env[n]}" for n in seen)


def _tasks_per_node(spec: str) -> list[int] | None:
    """Slurm's compressed per-node counts: ``"4(x2),3"`` -> ``[4, 4, 3]``."""
    out: list[int] = []
    for part in spec.strip().split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", part)
        if m is None:
            return None
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out or None


def _launch(
    env: Mapping[str, str],
    kind: str,
    rank: int | None,
    size: int | None,
    local_rank: int | None,
    local_size: int | None,
    names: list[str | None],
    extra: str = "",
) -> Launch:
    if size is not None and size < 1:
        size = None
    if rank is not None and size is not None and rank >= size:
        size = None  # contradictory: let MPI (or the caller) decide
    if local_size is not None and (local_size < 1 or (size is not None and local_size > size)):
        local_size = None
    if local_rank is not None and local_size is not None and local_rank >= local_size:
        local_size = None
    source = " ".join(x for x in (_source(env, names), extra) if x)
    return Launch(kind, rank, size, local_rank, local_size, source)


def _slurm_step(env: Mapping[str, str]) -> Launch | None:
    """This process as a task of an srun step, or None (no step: batch shell, salloc)."""
    rank = _int(env, "SLURM_PROCID")
    if rank is None:
        return None
    step_name = "SLURM_STEP_ID" if "SLURM_STEP_ID" in env else "SLURM_STEPID"
    step = _int(env, step_name)
    if not ((step is not None and step < _SLURM_SPECIAL_STEP) or rank > 0):
        return None
    size, size_name = _first(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
    local_rank = _int(env, "SLURM_LOCALID")
    local_size, local_name = None, None
    node = _int(env, "SLURM_NODEID")
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        counts = _tasks_per_node(env[name]) if name in env else None
        if counts is not None and node is not None and node < len(counts):
            local_size, local_name = counts[node], name
            break
    if local_size is None:
        local_size, local_name = _first(env, "SLURM_NTASKS_PER_NODE")
    names = ["SLURM_PROCID", size_name, step_name, "SLURM_LOCALID", local_name]
    return _launch(env, "slurm", rank, size, local_rank, local_size, names)


def torch_launch(environ: Mapping[str, str] | None = None) -> Launch | None:
    """The torch.distributed variables alone (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE``) as a ``"torchrun"`` :class:`Launch`, whatever else started the
    process; None when ``WORLD_SIZE`` is not a number. :func:`detect` applies the
    precedence; this is for the torch adapter, which may build its world from these
    variables inside an srun step."""
    env = os.environ if environ is None else environ
    size = _int(env, "WORLD_SIZE")
    if size is None:
        return None
    names: list[str | None] = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"]
    names += ["TORCHELASTIC_RUN_ID", "GROUP_RANK"]
    rank, local_rank, local_size = (
        _int(env, n) for n in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    )
    return _launch(env, "torchrun", rank, size, local_rank, local_size, names)


def _mpi(env: Mapping[str, str]) -> Launch | None:
    if "OMPI_COMM_WORLD_RANK" in env or "OMPI_COMM_WORLD_SIZE" in env:
        kind = "openmpi"
        names: list[str | None] = [
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ]
    elif "PMI_RANK" in env or "PMI_SIZE" in env:
        kind = "hydra"
        names = ["PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"]
    elif "PMIX_RANK" in env:
        kind = "pmix"
        names = ["PMIX_RANK", "PMIX_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"]
    elif "MPI_LOCALNRANKS" in env or "MPI_LOCALRANKID" in env:
        kind = "hydra"  # Hydra's node variables alone: an MPI launch of unknown size
        names = [None, None, "MPI_LOCALRANKID", "MPI_LOCALNRANKS"]
    else:
        return None
    rank, size, local_rank, local_size = (_int(env, n) if n else None for n in names)
    step, extra = _slurm_step(env), ""
    if (
        step is not None
        and rank is not None
        and step.rank == rank
        and (size is None or step.size == size)
        and (size is None or local_size is None)
    ):
        # srun --mpi=pmi2/pmix: the step numbers the tasks as the PMI does; fill the gaps
        if size is None:
            size = step.size
        if local_rank is None and local_size is None:
            local_rank, local_size = step.local_rank, step.local_size
        extra = step.source
    return _launch(env, kind, rank, size, local_rank, local_size, names, extra)


def detect(environ: Mapping[str, str] | None = None) -> Launch:
    """The launcher that started this process, from *environ* (default ``os.environ``).

    Pure: reads the mapping and nothing else (no MPI, no files). See the module
    docstring for the rule and its order.

    Examples
    --------
    >>> launch = detect({"PMI_RANK": "2", "PMI_SIZE": "4"})
    >>> launch.kind, launch.rank, launch.size, launch.mpi_world
    ('hydra', 2, 4, True)
    >>> detect({"SLURM_NTASKS": "4", "SLURM_PROCID": "0"}).mpi_world  # an sbatch script
    False
    """
    env = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" in env or "GROUP_RANK" in env:  # torchrun is the parent
        found = torch_launch(env)
        if found is not None:
            return found
    for probe in (_mpi, _slurm_step, torch_launch):
        found = probe(env)
        if found is not None:
            return found
    return Launch("none", 0, 1, 0, 1)


def rank_from_env(environ: Mapping[str, str] | None = None) -> int:
    """This process's global rank according to its launcher (0 when unknown or none)."""
    rank = detect(environ).rank
    return rank if rank is not None else 0


def check_mpi_size(launch: Launch, mpi_size: int) -> None:
    """Raise :class:`LaunchMismatchError` when *launch* started several processes but
    MPI sees *mpi_size* = 1: each process would be a world of its own and read the
    whole dataset."""
    if launch.size is None or launch.size <= 1 or mpi_size != 1:
        return
    n = launch.size
    if launch.kind == "slurm":
        fix = (
            "the tasks got no process-management interface (PMI) this MPI understands. "
            "Launch with `srun --mpi=pmi2` or `srun --mpi=pmix` (`srun --mpi=list` shows "
            f"what Slurm offers), or with `mpiexec -n {n}` inside the allocation"
        )
    else:
        fix = (
            "mpi4py's MPI library does not speak this launcher's process manager (e.g. "
            "Open MPI's mpirun with an MPICH mpi4py, or the reverse). Launch with the "
            "mpiexec of the MPI mpi4py uses "
            '(python -c "from mpi4py import MPI; print(MPI.Get_library_version())")'
        )
    hint = ""
    if "WORLD_SIZE" in os.environ:
        hint = "; for a torch.distributed job without MPI, use feedline.torch.FeedlineDataset"
    raise LaunchMismatchError(
        f"{launch.describe()} started {n} processes but MPI sees 1 (MPI_COMM_WORLD has one "
        f"rank), so every rank would read the whole dataset: {fix}, or pass comm= "
        f"explicitly{hint}"
    )


def launcher_comm(launch: Launch | None = None) -> Any:
    """``MPI.COMM_WORLD`` when *launch* (default: :func:`detect`) asks for an MPI world
    (:attr:`Launch.mpi_world`), checked with :func:`check_mpi_size`; else None, without
    importing mpi4py.

    Raises
    ------
    ConfigError
        mpi4py is missing under a multi-process launch.
    LaunchMismatchError
        The launcher started several processes but MPI sees one.
    """
    launch = detect() if launch is None else launch
    if not launch.mpi_world:
        return None
    try:
        from mpi4py import MPI
    except ImportError:
        raise ConfigError(
            f"started by {launch.describe()} but mpi4py is missing: pip install mpi4py mpich"
        ) from None
    comm = MPI.COMM_WORLD
    check_mpi_size(launch, comm.Get_size())
    return comm


def job_comm(advice: str) -> Any:
    """The communicator of this job as its launcher started it: ``MPI.COMM_WORLD`` for a
    multi-process MPI launch or srun step (:func:`launcher_comm`), None for one process.
    A multi-process torchrun launch without MPI raises :class:`ConfigError` ending with
    *advice* (what the caller offers instead), so that no rank reads everything."""
    launch = detect()
    if launch.mpi_world:
        return launcher_comm(launch)  # raises when MPI sees 1 of N processes
    if launch.kind == "torchrun" and launch.multi_process:
        raise ConfigError(f"started by {launch.describe()} without MPI: {advice}")
    return None
