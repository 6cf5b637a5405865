# SPDX-License-Identifier: Apache-2.0
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
import json
import logging
import os
from typing import Any, Literal

import numpy as np

from . import defaults
from .errors import ConfigError, CorruptDataError, StaleDatasetError, StorageError
from .formats import detect, get_format
from .formats.base import Decoder, Format, RawDecoder
from .index import Index, dataset_fingerprint, fingerprint, load_sidecar, write_sidecar

OnStale = Literal["rebuild", "error"]
log = logging.getLogger("feedline")


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


_SAID: set[str] = set()


def _say_once(root: str, note: str) -> None:
    """Log *note* about the dataset at *root* once per process, on rank 0 only."""
    from .progress import process_rank

    if root not in _SAID and process_rank() == 0:
        log.warning("feedline: %s: %s", root, note)
    _SAID.add(root)


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
    decode_note : str or None
        Why records are delivered as raw bytes when the format's decoder does not apply
        (e.g. an LMDB whose records are not Caffe ``Datum``); None otherwise.
    """

    def __init__(
        self,
        fmt: Format,
        *,
        comm: Any = None,
        sidecar: bool = True,
        on_stale: OnStale = "rebuild",
        progress: bool | None = None,
        decode: bool | None = None,
    ) -> None:
        if decode is not None and not isinstance(decode, bool):
            raise ConfigError(f"decode must be True, False or None (detect), not {decode!r}")
        if on_stale not in ("rebuild", "error"):
            raise ConfigError(f"on_stale must be 'rebuild' or 'error', not {on_stale!r}")
        self._fmt = fmt
        self.format: str = fmt.name
        self.files: list[str] = fmt.files
        self.root: str = fmt.root
        self.options: dict[str, Any] = dict(fmt.opts)
        self.comm = comm
        self.sidecar = sidecar
        self.on_stale: OnStale = on_stale
        self.progress = bool(defaults.get("progress")) if progress is None else progress
        self._index: Index | None = None
        self._decode = decode
        self._decoders: dict[bool, Decoder] = {}
        self.decode_note: str | None = None
        self._unpacker: Any = None
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

    def _read_stored(self, i: int) -> bytes:
        """The stored bytes of sample *i*'s extent (one pread)."""
        fid, off, length = self.index.extent(i)
        try:
            data = os.pread(self._fd(fid), length, off)
        except OSError as e:
            raise StorageError(self.files[fid], off, e.errno or 0) from e
        if len(data) != length:
            raise CorruptDataError(self.files[fid], off + len(data), "file shorter than its index")
        return data

    def read(self, i: int) -> bytes:
        """The raw record of sample *i* (one pread; compressed data: its span, unpacked)."""
        idx = self.index
        n = len(idx)
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range for {n} samples")
        i = int(i) % n
        data = self._read_stored(i)
        if idx.packed is None:
            return data
        rec, _ = self.unpack(np.frombuffer(data, dtype=np.uint8), np.array([len(data)]), [i])
        return rec.tobytes()

    def read_many(self, ids) -> tuple[np.ndarray, np.ndarray]:
        """Records of *ids*, concatenated, and their lengths."""
        ids = np.asarray(ids, dtype=np.int64)
        lengths = np.asarray(self.index.lengths[ids], dtype=np.int64)
        out = np.empty(int(lengths.sum()), dtype=np.uint8)
        pos = 0
        for i, ln in zip(ids, lengths, strict=True):
            out[pos : pos + ln] = np.frombuffer(self._read_stored(int(i)), dtype=np.uint8)
            pos += int(ln)
        return self.unpack(out, lengths, ids)

    @property
    def packed(self) -> bool:
        """True when the records are stored compressed (see :meth:`unpack`)."""
        return self.index.packed is not None

    def unpack(self, raw, lengths, ids) -> tuple[np.ndarray, np.ndarray]:
        """Records from a raw batch of stored extents: ``(records, lengths)``.

        The identity for uncompressed data; for compressed data each distinct span of
        the batch (HDF5 chunk, gzip segment) is unpacked once and the records cut out.
        """
        if self.index.packed is None:
            return raw, lengths
        if self._unpacker is None:
            from .formats.packed import Unpacker

            self._unpacker = Unpacker(self.index)
        return self._unpacker.unpack(raw, lengths, ids)

    @property
    def decodes(self) -> bool:
        """Whether records are decoded: the ``decode=`` given to :func:`open_dataset`, or
        detected from the first records (an LMDB whose records are not Caffe ``Datum``
        gives raw bytes, said once in the ``feedline`` log and in ``feedline inspect``)."""
        if self._decode is None:
            try:
                note = self._fmt.detect_decode(self.index)
            except OSError:  # unreadable now: the reads say so, typed, on every rank
                note = None
            self._decode = note is None
            if note is not None:
                self.decode_note = note
                _say_once(self.root, note)
        return self._decode

    def decoder_for(self, decode: bool) -> Decoder:
        """The format's decoder (*decode* True) or the raw-bytes one, made once."""
        dec = self._decoders.get(bool(decode))
        if dec is None:
            dec = self._fmt.make_decoder(self.index) if decode else RawDecoder(self.index)
            self._decoders[bool(decode)] = dec
        return dec

    @property
    def decoder(self) -> Decoder:
        """The decoder for this dataset (see :attr:`decodes`)."""
        return self.decoder_for(self.decodes)

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
            info["record_bytes_min"] = int(idx.record_lengths.min())
            info["record_bytes_max"] = int(idx.record_lengths.max())
            info["record_bytes_mean"] = float(idx.record_lengths.mean())
        info["payload_fraction"] = info["payload_bytes"] / max(1, info["file_bytes"])
        if idx.packed is not None:  # compressed: the payload is the spans' stored bytes
            stored = int(idx.lengths[np.unique(idx.packed.span, return_index=True)[1]].sum())
            info["payload_bytes"] = stored
            info["payload_fraction"] = stored / max(1, info["file_bytes"])
            info["compressed_spans"] = len(idx.packed.span_out)
            info["unpacked_record_bytes"] = int(idx.packed.size.sum())
            info["compression_ratio"] = round(info["unpacked_record_bytes"] / max(1, stored), 3)
        info.update(self._fmt.describe(idx))
        if not self.decodes:
            info["decode"] = self.decode_note or "raw bytes (decode=False)"
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
        state["_unpacker"] = None
        return state


def _expand_node(path_or_paths, comm):
    """Replace ``{node}`` by this rank's (emulated) node index (node = rank * nodes //
    ranks, docs/benchmarks.md)."""
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
    decode: bool | None = None,
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
    comm : MPI communicator (``MPI.Comm``), optional
        When given, one rank per node builds or loads the index and shares it.
    sidecar : bool
        Cache the index in a sidecar file (default True).
    on_stale : {"rebuild", "error"}
        What to do when a sidecar no longer matches the files.
    decode : bool or None
        Decode records with the format's decoder (True), deliver raw bytes (False), or
        detect (None, default): an LMDB whose first records are not Caffe ``Datum``
        (pickled, msgpack, JPEG bytes ...) is delivered as raw bytes.
    **options
        Format options: ``record_bytes``, ``label_bytes``, ``header_bytes`` (records),
        ``dataset``, ``labels`` (HDF5).

    Returns
    -------
    Dataset

    Raises
    ------
    DatasetNotFoundError
        A path that does not exist (also a ``FileNotFoundError``).
    UnsupportedFormatError
        The format cannot be told from the path (the message lists what was tried).
    """
    path_or_paths = _expand_node(path_or_paths, comm)
    name = format or detect(path_or_paths)
    cls = get_format(name)
    fmt = cls(path_or_paths, **options)
    return Dataset(
        fmt, comm=comm, sidecar=sidecar, on_stale=on_stale, progress=progress, decode=decode
    )


#: open_dataset's own keyword options (format options are each format's ``options``)
OPEN_OPTIONS = ("format", "sidecar", "on_stale", "progress", "decode")


def as_dataset(data, comm: Any, options: dict[str, Any]) -> Dataset:
    """*data* as a Dataset: an opened one as is, else ``open_dataset(data, ...)`` with the
    options that belong to it (``format``, ``sidecar``, ``on_stale``, ``progress``,
    ``decode`` and the format's own, e.g. ``dataset=``/``labels=`` for HDF5), which are
    removed from *options* (the Loader's keyword arguments)."""
    if isinstance(data, Dataset):
        mine = sorted(k for k in options if k in OPEN_OPTIONS or k in type(data._fmt).options)
        if mine:
            raise ConfigError(
                f"{mine} are open_dataset options: pass them to open_dataset(...), or give "
                "the Loader a path instead of an opened Dataset"
            )
        return data
    if not isinstance(data, str | os.PathLike | list | tuple):
        raise ConfigError(
            "the Loader reads a path (str or os.PathLike), a list of paths or a Dataset from "
            f"feedline.open_dataset, not {type(data).__name__}"
        )
    if isinstance(data, list | tuple) and not all(isinstance(p, str | os.PathLike) for p in data):
        raise ConfigError("a list of dataset files must hold paths (str or os.PathLike)")
    name = options.get("format")
    if name is None:
        name = detect(_expand_node(data, comm))
    fmt_options = set(get_format(name).options)
    kw = {k: options.pop(k) for k in list(options) if k in OPEN_OPTIONS or k in fmt_options}
    kw["format"] = name
    return open_dataset(data, comm=comm, **kw)


#: the manifest ``feedline make`` writes into a generated dataset's directory
MANIFEST = ".feedline-make.json"


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The manifest of a generated dataset directory (or of the directory of a file)."""
    p = os.fspath(path)
    d = p if os.path.isdir(p) else os.path.dirname(os.path.abspath(p))
    try:
        with open(os.path.join(d, MANIFEST)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
