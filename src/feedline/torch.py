# SPDX-License-Identifier: Apache-2.0
"""PyTorch adapter: feedline batches as tensors, in an ``IterableDataset``.

feedline already runs its own reader and decode threads and splits every global batch
among the ranks, so the adapter is thin: :class:`FeedlineDataset` yields whole
sub-batches as tensors (``torch.from_numpy``, no copy; pinned in the loader's worker
threads when asked and a GPU exists). Use it directly, or in ``DataLoader(ds,
batch_size=None, num_workers=0)``; worker processes would each re-read the data, so
``num_workers > 0`` is refused with a message, and a DataLoader that batches again
(its default ``batch_size=1``) gets a warning: it would add a dimension of 1.

Variable-length raw records (``decode=False``, or an LMDB of pickled/JPEG values) are
not one tensor: ``ragged="list"`` (default) gives a list of per-sample uint8 tensors,
``ragged="pad"`` a ``(b, L)`` uint8 tensor padded with zeros plus the lengths.

Launchers (docs/getting-started.md): under ``mpiexec``/``srun`` the world comes from MPI. Under
``torchrun`` without MPI it is built from the torch.distributed environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``: nodes are the blocks of ``LOCAL_WORLD_SIZE``
contiguous ranks torchrun assigns), or refused with a message — never every rank
reading everything.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info
from torch.utils.data._utils.fetch import _BaseDatasetFetcher

from . import defaults
from .errors import ConfigError
from .loader import Batch, Loader
from .pipeline.world import LoaderWorld, launched_by_mpi, torch_env_world

__all__ = ["FeedlineDataset", "torch_world"]


def torch_world(nodes: int = 0) -> LoaderWorld | None:
    """The world of a ``torchrun`` job without MPI, or None when not under torchrun.

    Uses ``torch.distributed`` when it is initialised (and checks it agrees with the
    environment), else ``RANK``/``WORLD_SIZE``/``LOCAL_WORLD_SIZE``.

    Raises
    ------
    ConfigError
        When the ranks cannot be placed in equal node blocks, or the environment and
        the process group disagree.
    """
    if launched_by_mpi() > 1:
        return None
    env = torch_env_world()
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        rank, size = dist.get_rank(), dist.get_world_size()
        if env is not None and (env[0], env[1]) != (rank, size):
            raise ConfigError(
                f"torch.distributed says rank {rank} of {size}, the environment "
                f"RANK={env[0]} WORLD_SIZE={env[1]}; feedline will not guess which is right"
            )
        local = env[2] if env is not None else size
    elif env is not None:
        rank, size, local = env
    else:
        return None
    if size <= 1:
        return None
    if nodes == 0:
        if local < 1 or size % local:
            raise ConfigError(
                f"WORLD_SIZE={size} is not a multiple of LOCAL_WORLD_SIZE={local}: cannot tell "
                "the nodes apart; set FEEDLINE_NODES or launch with mpiexec"
            )
        nodes = size // local
    return LoaderWorld(rank, size, nodes, emulated=False, launcher="torch")


class FeedlineDataset(IterableDataset):
    """A feedline :class:`~feedline.Loader` as a PyTorch ``IterableDataset``.

    Each item is one step's sub-batch of this rank: ``(data, labels)`` tensors (labels
    may be None), then ``lengths`` when ``ragged="pad"``, then ``ids`` with
    ``with_ids=True``; or, with ``as_dict=True``, a dict with keys ``data``,
    ``labels``, ``lengths`` and ``ids``.

    Parameters
    ----------
    dataset : feedline.Dataset
    batch_size : int
        The global batch (all ranks together).
    pin_memory : bool
        Pin the tensors (in the loader's threads) when CUDA is available; without a GPU
        this warns once and does nothing.
    with_ids : bool
        Also yield the global sample ids.
    ragged : {"list", "pad"}
        Variable-length raw records as a list of per-sample uint8 tensors (``"list"``,
        default), or as one ``(b, L)`` uint8 tensor padded with zeros to the longest
        record (``"pad"``; *pad_to* fixes L) followed by the int64 lengths.
    pad_to : int, optional
        Width of the padded tensor (``ragged="pad"``); default: the longest record of
        the batch.
    as_dict : bool
        Yield dicts (``data``, ``labels``, ``lengths``, ``ids``) instead of tuples.
    transform : callable, optional
        Applied to the numpy :class:`~feedline.Batch` before conversion, in the loader's
        worker threads.
    comm : MPI communicator (``MPI.Comm``), optional
        As for the Loader; under torchrun without MPI the world is built from
        torch.distributed (see :func:`torch_world`).
    **loader_options
        Everything else :class:`feedline.Loader` takes (``preset``, ``seed``, ...).
    """

    def __init__(
        self,
        dataset,
        batch_size: int,
        *,
        pin_memory: bool = False,
        with_ids: bool = False,
        ragged: str = "list",
        pad_to: int | None = None,
        as_dict: bool = False,
        transform: Callable[[Batch], Batch] | None = None,
        comm: Any = None,
        **loader_options: Any,
    ) -> None:
        super().__init__()
        if ragged not in ("list", "pad"):
            raise ConfigError(f"ragged must be 'list' or 'pad', not {ragged!r}")
        self.with_ids = with_ids
        self.ragged = ragged
        self.pad_to = pad_to
        self.as_dict = bool(as_dict)
        self._user_transform = transform
        self._pin = bool(pin_memory) and torch.cuda.is_available()
        if pin_memory and not self._pin:
            warnings.warn(
                "feedline.torch: pin_memory=True but no GPU is available; not pinning",
                RuntimeWarning,
                stacklevel=2,
            )
        if comm is None:
            comm = torch_world(int(loader_options.get("nodes", 0) or defaults.get("nodes") or 0))
        self.loader = Loader(
            dataset, batch_size, comm=comm, transform=self._convert, **loader_options
        )

    # ------------------------------------------------------------ conversion
    def _convert(self, batch: Batch):
        if self._user_transform is not None:
            batch = self._user_transform(batch)
        lengths = torch.from_numpy(np.asarray(batch.lengths, dtype=np.int64))
        if isinstance(batch, Batch) and batch.ragged:
            if self.ragged == "pad":
                padded, _ = batch.padded(self.pad_to)
                data: Any = _tensor(padded, self._pin)
            else:
                data = [_tensor(s.copy(), self._pin) for s in batch.samples()]
        else:
            data = _tensor(batch.data, self._pin)
        labels = None if batch.labels is None else _tensor(batch.labels, self._pin)
        ids = torch.from_numpy(batch.ids)
        return _TorchBatch(data, labels, ids, batch, lengths)

    def __iter__(self) -> Iterator[Any]:
        if get_worker_info() is not None:  # forked DataLoader worker
            raise ConfigError(_NO_WORKERS)
        _warn_if_batched_again()
        for tb in self.loader:
            if self.as_dict:
                yield {"data": tb.data, "labels": tb.labels, "lengths": tb.lengths, "ids": tb.ids}
                continue
            item: tuple = (tb.data, tb.labels)
            if self.ragged == "pad":
                item += (tb.lengths,)
            yield (*item, tb.ids) if self.with_ids else item

    def __getstate__(self):  # spawned DataLoader workers pickle the dataset
        raise ConfigError(_NO_WORKERS)

    # ------------------------------------------------------------ delegation
    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        """See :meth:`feedline.Loader.set_epoch`."""
        self.loader.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """See :meth:`feedline.Loader.state_dict` (identical on every rank)."""
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """See :meth:`feedline.Loader.load_state_dict`."""
        self.loader.load_state_dict(state, strict=strict)

    def stats(self) -> dict[str, Any]:
        """See :meth:`feedline.Loader.stats`."""
        return self.loader.stats()

    def close(self) -> None:
        """Stop the loader's threads."""
        self.loader.close()

    def __enter__(self) -> FeedlineDataset:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_NO_WORKERS = (
    "feedline.torch.FeedlineDataset runs its own reader threads and splits the data among "
    "ranks itself: use DataLoader(..., batch_size=None, num_workers=0) or iterate the "
    "dataset directly"
)


def _warn_if_batched_again() -> None:
    """Warn when a torch DataLoader with ``batch_size`` not None iterates this dataset:
    it would collate feedline's sub-batches again (a leading dimension of 1 with the
    default ``batch_size=1``). Found from the DataLoader's fetcher up the stack."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            return
        owner = frame.f_locals.get("self")
        if isinstance(owner, _BaseDatasetFetcher):
            if owner.auto_collation:
                warnings.warn(
                    "feedline.torch.FeedlineDataset already yields whole sub-batches; this "
                    "DataLoader batches them again (adding a dimension): use "
                    "DataLoader(ds, batch_size=None) or iterate the dataset directly",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return
        frame = frame.f_back


class _TorchBatch:
    """Tensors of one sub-batch, carrying what the Loader counts (ids, lengths, nbytes)."""

    __slots__ = ("batch", "data", "ids", "labels", "lengths", "nbytes")

    def __init__(self, data, labels, ids, batch: Batch, lengths) -> None:
        self.data, self.labels, self.ids, self.batch = data, labels, ids, batch
        self.lengths = lengths
        self.nbytes = int(np.asarray(batch.lengths).sum())


def _tensor(x, pin: bool) -> torch.Tensor:
    t = x if isinstance(x, torch.Tensor) else torch.from_numpy(_writable(x))
    return t.pin_memory() if pin else t


def _writable(a):
    a = np.asarray(a)
    return a if a.flags.writeable else a.copy()  # torch warns on read-only buffers
