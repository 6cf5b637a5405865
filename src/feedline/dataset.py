"""Dataset: a format bound to files, with a lazily built (or cached) Index.

``open_dataset`` detects the format, validates options and returns a Dataset. The index
is built on first use, or loaded from a sidecar when one matches. With a ``comm``, one
rank per node builds or loads the index and the node's other ranks map the same sidecar
(or receive it over the node communicator when no sidecar can be written), so start-up
touches the file system O(nodes) times, not O(ranks).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from typing import Any, Literal

import numpy as np

from . import defaults
from .errors import ConfigError, CorruptDataError, StaleDatasetError, StorageError
from .formats import detect, get_format
from .formats.base import Decoder, Format
from .index import Index, dataset_fingerprint, fingerprint, load_sidecar, write_sidecar

OnStale = Literal["rebuild", "error"]


def sidecar_candidates(root: str, files: list[str], key: str) -> list[str]:
    """Where a sidecar may live: beside the dataset first, then in the cache directory."""
    if (
        len(files) == 1
        and os.path.dirname(files[0]) == root
        and not os.path.exists(os.path.join(root, "data.mdb"))
    ):
        local = os.path.join(root, f".{os.path.basename(files[0])}.{key}.fidx")
    else:
        local = os.path.join(root, f".feedline.{key}.fidx")
    ident = hashlib.sha256(f"{os.path.realpath(root)}|{key}".encode()).hexdigest()[:24]
    cached = os.path.join(defaults.get("cache_dir"), f"{ident}.fidx")
    return [local, cached]


class Dataset:
    """A dataset opened by :func:`open_dataset`.

    Attributes
    ----------
    format : str
        Format name (``"lmdb"``, ``"hdf5"``, ...).
    files : list of str
        Absolute paths of the dataset files.
    root : str
        Directory the file names are relative to (for sidecars shared by node views).
    """

    def __init__(
        self,
        fmt: Format,
        *,
        comm: Any = None,
        sidecar: bool = True,
        on_stale: OnStale = "rebuild",
        progress: bool | None = None,
    ) -> None:
        if on_stale not in ("rebuild", "error"):
            raise ConfigError(f"on_stale must be 'rebuild' or 'error', not {on_stale!r}")
        self._fmt = fmt
        self.format: str = fmt.name
        self.files: list[str] = fmt.files
        self.root: str = fmt.root
        self.options: dict[str, Any] = dict(fmt.options)
        self.comm = comm
        self.sidecar = sidecar
        self.on_stale: OnStale = on_stale
        self.progress = bool(defaults.get("progress")) if progress is None else progress
        self._index: Index | None = None
        self._decoder: Decoder | None = None
        self._fds: dict[int, int] = {}
        self.sidecar_path: str | None = None
        self._fingerprint: str | None = None

    # ----------------------------------------------------------------- index
    @property
    def index(self) -> Index:
        """The Index, built or loaded on first use."""
        if self._index is None:
            if self.comm is not None:
                from .dist.world import World

                self._index = World.from_comm(self.comm).share_index(self._load_or_build)
            else:
                self._index = self._load_or_build()
        return self._index

    def build_index(self) -> Index:
        """Scan the files now (no sidecar), and keep the result."""
        self._index = self._fmt.build_index(progress=self.progress)
        self._index.validate_against_sizes([os.path.getsize(f) for f in self.files])
        return self._index

    def _load_or_build(self) -> Index:
        key = self._fmt.sidecar_key()
        if self.sidecar:
            for cand in sidecar_candidates(self.root, self.files, key):
                if not os.path.exists(cand):
                    continue
                try:
                    idx = load_sidecar(cand, root=self.root, files=self.files, key=key)
                    idx.validate_against_sizes([os.path.getsize(f) for f in self.files])
                    self.sidecar_path = cand
                    return idx
                except (StaleDatasetError, CorruptDataError):
                    if self.on_stale == "error":
                        raise
                except OSError:  # another user's sidecar we may not read: try the next
                    continue
        idx = self.build_index()
        if self.sidecar:
            self.sidecar_path = self.write_sidecar(idx)
        return idx

    def write_sidecar(self, idx: Index | None = None) -> str | None:
        """Cache the index beside the dataset (or in the cache dir); return where."""
        idx = idx if idx is not None else self.index
        key = self._fmt.sidecar_key()
        fps = [fingerprint(f) for f in self.files]
        for cand in sidecar_candidates(self.root, self.files, key):
            try:
                os.makedirs(os.path.dirname(cand), exist_ok=True)
                write_sidecar(cand, idx, root=self.root, fingerprints=fps, key=key)
                return cand
            except OSError:
                continue
        return None

    @property
    def fingerprint(self) -> str:
        """Digest of the dataset files (names, sizes, head/tail hashes)."""
        if self._fingerprint is None:
            self._fingerprint = dataset_fingerprint(self.files)
        return self._fingerprint

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return len(self.index)

    def __repr__(self) -> str:
        n = len(self._index) if self._index is not None else "?"
        return f"<feedline.Dataset format={self.format} files={len(self.files)} samples={n}>"

    def _fd(self, file_id: int) -> int:
        fd = self._fds.get(file_id)
        if fd is None:
            fd = os.open(self.files[file_id], os.O_RDONLY)
            self._fds[file_id] = fd
        return fd

    def read(self, i: int) -> bytes:
        """The raw record of sample *i* (one pread)."""
        idx = self.index
        n = len(idx)
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range for {n} samples")
        fid, off, length = idx.extent(int(i) % n)
        try:
            data = os.pread(self._fd(fid), length, off)
        except OSError as e:
            raise StorageError(self.files[fid], off, e.errno or 0) from e
        if len(data) != length:
            raise CorruptDataError(self.files[fid], off + len(data), "file shorter than its index")
        return data

    def read_many(self, ids) -> tuple[np.ndarray, np.ndarray]:
        """Records of *ids*, concatenated, and their lengths."""
        ids = np.asarray(ids, dtype=np.int64)
        lengths = np.asarray(self.index.lengths[ids], dtype=np.int64)
        out = np.empty(int(lengths.sum()), dtype=np.uint8)
        pos = 0
        for i, ln in zip(ids, lengths, strict=True):
            out[pos : pos + ln] = np.frombuffer(self.read(int(i)), dtype=np.uint8)
            pos += int(ln)
        return out, lengths

    @property
    def decoder(self) -> Decoder:
        """The format's decoder for this dataset."""
        if self._decoder is None:
            self._decoder = self._fmt.make_decoder(self.index)
        return self._decoder

    def decode(self, raw, lengths, ids, out=None):
        """Decode a batch of raw records; see :meth:`Decoder.decode`."""
        return self.decoder.decode(raw, lengths, np.asarray(ids, dtype=np.int64), out=out)

    def __getitem__(self, i: int):
        """Decoded sample *i*: ``(data, label)``."""
        raw = np.frombuffer(self.read(i), dtype=np.uint8)
        data, labels = self.decode(raw, np.array([raw.size]), [i % len(self)])
        return data[0], (None if labels is None else labels[0])

    def describe(self) -> dict[str, Any]:
        """Layout facts for ``feedline inspect``."""
        idx = self.index
        info: dict[str, Any] = {
            "format": self.format,
            "files": len(self.files),
            "samples": len(idx),
            "file_bytes": int(sum(os.path.getsize(f) for f in self.files)),
            "payload_bytes": idx.nbytes_payload,
        }
        if len(idx):
            info["record_bytes_min"] = int(idx.lengths.min())
            info["record_bytes_max"] = int(idx.lengths.max())
            info["record_bytes_mean"] = float(idx.lengths.mean())
        info["payload_fraction"] = info["payload_bytes"] / max(1, info["file_bytes"])
        info.update(self._fmt.describe(idx))
        return info

    def close(self) -> None:
        """Close file descriptors opened by :meth:`read`."""
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_fds"] = {}
        state["comm"] = None
        return state


def _expand_node(path_or_paths, comm):
    """Replace ``{node}`` by this rank's (emulated) node index, as DESIGN.md defines it."""
    items = path_or_paths if isinstance(path_or_paths, list | tuple) else [path_or_paths]
    if not any("{node}" in os.fspath(p) for p in items):
        return path_or_paths
    from .dist.world import World

    return World.from_comm(comm).expand_path(path_or_paths)


def open_dataset(
    path_or_paths,
    format: str | None = None,
    comm: Any = None,
    *,
    sidecar: bool = True,
    on_stale: OnStale = "rebuild",
    progress: bool | None = None,
    **options: Any,
) -> Dataset:
    """Open a dataset for feedline.

    Parameters
    ----------
    path_or_paths : str, path, glob or list
        An LMDB directory (with ``data.mdb``), an HDF5/TFRecord/npy file, a directory
        or glob of such files, or a list of files. ``{node}`` is replaced by this
        rank's node index (emulated nodes: ``FEEDLINE_NODES``), for per-node mounts.
    format : str, optional
        ``"lmdb"``, ``"hdf5"``, ``"tfrecord"``, ``"npy"`` or ``"records"``; detected
        from the path when omitted (``"records"`` must be named).
    comm : mpi4py communicator, optional
        When given, one rank per node builds or loads the index and shares it.
    sidecar : bool
        Cache the index in a sidecar file (default True).
    on_stale : {"rebuild", "error"}
        What to do when a sidecar no longer matches the files.
    **options
        Format options: ``record_bytes``, ``label_bytes``, ``header_bytes`` (records),
        ``dataset``, ``labels`` (HDF5).

    Returns
    -------
    Dataset
    """
    path_or_paths = _expand_node(path_or_paths, comm)
    name = format or detect(path_or_paths)
    cls = get_format(name)
    fmt = cls(path_or_paths, **options)
    return Dataset(fmt, comm=comm, sidecar=sidecar, on_stale=on_stale, progress=progress)
