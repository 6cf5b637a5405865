# SPDX-License-Identifier: Apache-2.0
"""Copies out of the DeepIO store's window (:class:`~feedline.dist.world.RmaArray`):
records from this rank's part or from a same-host rank's part that MPI placed in shared
memory, found by ``MPI_Win_shared_query``. mpi4py is imported lazily."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

#: a batch of at most this many records that all lie in shared memory or this rank's part
#: is copied record by record, without grouping by owner (:func:`copy_few`)
_DIRECT_LOOP = 64


def _shared_parts(win: Any, comm: Any, nbytes: int) -> list[np.ndarray | None]:
    """Per rank of *comm*: its part of *win* as an array this process loads from
    directly (``MPI_Win_shared_query``: ranks of this host whose memory MPI placed in
    shared memory), else None. Collective (*comm* split by host). Only with MPI 4 or
    later, where the query is defined for every window (answering "not shared" rather
    than failing); with an older MPI every entry is None."""
    from mpi4py import MPI

    parts: list[np.ndarray | None] = [None] * comm.Get_size()
    host = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        if MPI.Get_version() < (4, 0) or host.Get_size() == 1:
            return parts
        here = host.Get_group().Translate_ranks(list(range(host.Get_size())), comm.Get_group())
        for r in here:
            try:
                mem, _unit = win.Shared_query(r)
            except MPI.Exception:
                continue
            if mem is not None and len(mem) >= nbytes:
                parts[r] = np.frombuffer(mem, dtype=np.uint8)[:nbytes]
    finally:
        host.Free()
    return parts


def copy_few(
    array: np.ndarray,
    shared: Sequence[np.ndarray | None],
    rank: int,
    node: np.ndarray,
    owners: np.ndarray,
    disps: np.ndarray,
    lengths: np.ndarray,
    out: np.ndarray,
    dest: np.ndarray,
) -> tuple[int, int, int] | None:
    """:meth:`RmaArray.get <feedline.dist.world.RmaArray.get>` for a batch of at most
    ``_DIRECT_LOOP`` records that all lie in this rank's part or in shared memory: a copy
    per record, with no grouping by owner (the sort and split cost a store's batch of a
    few records more than its copies). Returns (bytes from other ranks of this node,
    bytes from other nodes, ranks read) — or None, copying nothing, when a record needs
    MPI."""
    ol = owners.tolist()
    srcs = []
    for o in ol:
        src = array if o == rank else (shared[o] if o < len(shared) else None)
        if src is None:
            return None
        srcs.append(src)
    here = int(node[rank])
    node_bytes = remote = 0
    others = set()
    for src, o, d, ln, t in zip(
        srcs, ol, disps.tolist(), lengths.tolist(), dest.tolist(), strict=True
    ):
        out[t : t + ln] = src[d : d + ln]
        if o != rank and ln > 0:
            others.add(o)
            if int(node[o]) == here:
                node_bytes += ln
            else:
                remote += ln
    return node_bytes, remote, len(others)
