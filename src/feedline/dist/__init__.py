"""Distribution over MPI: the only package that talks MPI (mpi4py, imported lazily)."""

from __future__ import annotations

from .world import NodeArray, Token, World, launched_by_mpi

__all__ = ["NodeArray", "Token", "World", "launched_by_mpi"]
