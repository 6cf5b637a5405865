# SPDX-License-Identifier: Apache-2.0
"""Distribution over MPI: the only package that talks MPI (mpi4py, imported lazily)."""

from __future__ import annotations

from .launch import Launch, LaunchMismatchError, detect, launcher_comm, rank_from_env
from .world import NodeArray, Token, World, launched_by_mpi

__all__ = [
    "Launch",
    "LaunchMismatchError",
    "NodeArray",
    "Token",
    "World",
    "detect",
    "launched_by_mpi",
    "launcher_comm",
    "rank_from_env",
]
