# SPDX-License-Identifier: Apache-2.0
"""Dataset formats: indexers and decoders, registered by name.

Formats register themselves on import; ``detect`` picks one from a path.
"""

from __future__ import annotations

import importlib
import os

from ..errors import DatasetNotFoundError, UnsupportedFormatError
from .base import FORMATS, Decoder, Format, RawDecoder, register

# name -> module that registers it (imported lazily so h5py etc. load only when used)
_MODULES = {
    "lmdb": "feedline.formats.lmdb",
    "hdf5": "feedline.formats.hdf5",
    "tfrecord": "feedline.formats.tfrecord",
    "npy": "feedline.formats.npy",
    "records": "feedline.formats.records",
    "files": "feedline.formats.files",
}


def get_format(name: str) -> type[Format]:
    """The Format class registered as *name*."""
    if name not in FORMATS:
        mod = _MODULES.get(name)
        if mod is None:
            raise UnsupportedFormatError(name, f"unknown format; known: {sorted(_MODULES)}")
        importlib.import_module(mod)
    return FORMATS[name]


def detect(path) -> str:
    """Guess the format of *path* (LMDB directory, .h5/.hdf5, .tfrecord(s), .npy).

    Raises
    ------
    DatasetNotFoundError
        *path* does not exist (and is not a glob).
    UnsupportedFormatError
        Nothing matched; the message lists what was tried.
    """
    if isinstance(path, list | tuple):
        if not path:
            raise UnsupportedFormatError("<empty list>", "no files given")
        path = path[0]
    p = os.fspath(path)
    if not os.path.exists(p) and not any(c in p for c in "*?["):
        raise DatasetNotFoundError(p)
    if os.path.isdir(p) and os.path.exists(os.path.join(p, "data.mdb")):
        return "lmdb"
    low = p.lower()
    if low.endswith(".mdb"):
        return "lmdb"
    if low.endswith((".h5", ".hdf5")):
        return "hdf5"
    if low.endswith((".tfrecord", ".tfrecords", ".tfrecord.gz", ".tfrecords.gz")):
        return "tfrecord"
    if low.endswith(".npy"):
        return "npy"
    if low.endswith((".npz", ".jpg", ".jpeg", ".png")):
        return "files"
    if os.path.isdir(p):
        names = sorted(f.lower() for f in os.listdir(p) if not f.startswith("."))
        for ext, fmt in (
            (".h5", "hdf5"),
            (".hdf5", "hdf5"),
            (".tfrecord", "tfrecord"),
            (".tfrecords", "tfrecord"),
            (".tfrecord.gz", "tfrecord"),
            (".tfrecords.gz", "tfrecord"),
            (".npy", "npy"),
        ):
            if any(n.endswith(ext) for n in names):
                return fmt
        from .files import EXTENSIONS

        if any(n.endswith(EXTENSIONS) for n in names):
            return "files"
    if os.path.isfile(p):
        from .tfrecord import looks_like_gzip_tfrecord

        if looks_like_gzip_tfrecord(p):  # e.g. train.gz, or TF's GZIP files under any name
            return "tfrecord"
    raise UnsupportedFormatError(
        p,
        "cannot tell the format. Tried: an LMDB directory (holding data.mdb) or a .mdb "
        "file; the extensions .h5/.hdf5 (hdf5), .tfrecord/.tfrecords (tfrecord), .npy "
        "(npy), .npz/.jpg/.png files (files)"
        + (" on the files inside the directory" if os.path.isdir(p) else "")
        + ". "
        "Pass format= (on the command line, --format) one of lmdb, hdf5, tfrecord, npy, "
        "files, records (fixed-size binary records: format='records' with record_bytes=, "
        "or --format records --record-bytes N)",
    )


__all__ = ["FORMATS", "Decoder", "Format", "RawDecoder", "detect", "get_format", "register"]
