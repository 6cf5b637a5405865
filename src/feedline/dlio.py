# SPDX-License-Identifier: Apache-2.0
"""feedline as a data loader of the DLIO benchmark 2.x (and so of MLPerf Storage).

``dlio_benchmark ++workload.reader.data_loader_classname=feedline.dlio.Loader
++workload.reader.data_loader_sampler=iterative`` makes DLIO read its generated dataset
through :class:`feedline.Loader`: DLIO's file list becomes a feedline dataset (``.npz``
/ ``.jpg`` / ``.png`` one sample per file -> the ``files`` format; TFRecord files -> the
``tfrecord`` format; HDF5 files -> rows of their ``records`` dataset), the Loader runs on
DLIO's own MPI communicator, its global batch is DLIO's per-rank batch times the number
of ranks, and its seed is DLIO's. Samples are delivered raw (DLIO's own readers decode
and then hand the model a fixed random image, so the model never sees the data
either way). The preset is ``feedline`` unless ``FEEDLINE_DLIO_PRESET`` names another.

This module imports DLIO only when :class:`Loader` is first used, so it stays
importable without ``dlio_benchmark`` installed.
"""

from __future__ import annotations

from typing import Any

from . import defaults

__all__ = ["Loader", "dataset_for"]  # noqa: F822 - Loader: module __getattr__

#: DLIO's format names -> feedline format and its options
_FORMATS: dict[str, tuple[str, dict[str, Any]]] = {
    "npz": ("files", {"extensions": ".npz"}),
    "jpeg": ("files", {"extensions": ".jpeg,.jpg"}),
    "png": ("files", {"extensions": ".png"}),
    "tfrecord": ("tfrecord", {}),
    "hdf5": ("hdf5", {"dataset": "records"}),
}


def dataset_for(files: list[str], dlio_format: str, comm: Any = None) -> Any:
    """The feedline dataset over DLIO's *files* of format *dlio_format*."""
    from . import open_dataset
    from .errors import ConfigError

    fmt = _FORMATS.get(str(dlio_format).lower())
    if fmt is None:
        raise ConfigError(
            f"feedline.dlio: DLIO format {dlio_format!r} is not supported; "
            f"supported: {sorted(_FORMATS)}"
        )
    name, opts = fmt
    return open_dataset(sorted(files), format=name, comm=comm, progress=False, **opts)


def _base() -> type:
    from dlio_benchmark.data_loader.base_data_loader import BaseDataLoader

    return BaseDataLoader


def _make_loader(base: type) -> type:
    from dlio_benchmark.common.enumerations import DataLoaderType, DatasetType
    from dlio_benchmark.utils.utility import DLIOMPI

    class Loader(base):  # type: ignore[misc, valid-type]
        """DLIO ``BaseDataLoader`` backed by :class:`feedline.Loader`."""

        def __init__(self, format_type: Any, dataset_type: Any, epoch: int) -> None:
            super().__init__(format_type, dataset_type, epoch, DataLoaderType.CUSTOM)
            self._loader: Any = None
            self._epoch: Any = None
            self.preset = str(defaults.get("dlio_preset"))

        def read(self) -> None:
            from . import Loader as FeedlineLoader

            train = self.dataset_type is DatasetType.TRAIN
            files = self._args.file_list_train if train else self._args.file_list_eval
            comm = DLIOMPI.get_instance().comm()
            size = comm.Get_size()
            ds = dataset_for(list(files), str(self.format_type), comm if size > 1 else None)
            self._loader = FeedlineLoader(
                ds,
                self.batch_size * size,
                preset=self.preset,
                seed=int(self._args.seed or 0),
                comm=comm if size > 1 else None,
                drop_last=True,
                decode=False,
            )

        def next(self):
            if self._loader is None:
                self.read()
            self._loader.set_epoch(max(0, int(self.epoch_number) - 1))
            self._epoch = iter(self._loader)
            for batch in self._epoch:
                yield batch.data
            self._epoch = None
            self.epoch_number += 1

        def finalize(self) -> None:
            # DLIO calls this after every epoch: end the pass, keep the Loader (its
            # dataset, index and threads' set-up) for the next epoch
            if self._epoch is not None:
                self._epoch.close()
                self._epoch = None

        def __del__(self) -> None:
            if self._loader is not None:
                self._loader.close()

    Loader.__module__ = __name__
    Loader.__qualname__ = "Loader"
    return Loader


def __getattr__(name: str) -> Any:
    """``feedline.dlio.Loader``: the BaseDataLoader subclass (DLIO imported here)."""
    if name == "Loader":
        cls = _make_loader(_base())
        globals()["Loader"] = cls
        return cls
    raise AttributeError(name)


def __dir__() -> list[str]:
    return sorted([*globals(), "Loader"])
