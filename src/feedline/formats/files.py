# SPDX-License-Identifier: Apache-2.0
"""A directory of files, one sample per file (``.npz``, ``.jpg``, ``.png``, ``.bin`` ...).

DLIO's unet3d (``.npz``) and image workloads, and most "ImageFolder"-style datasets,
store each sample as its own file. The index is one extent per file — offset 0, the
whole file — built from ``stat`` alone (no file is opened to index it), so the plan
reads whole files and the engine opens each file once per read. Labels come from the
``labels`` option (a ``.npy`` of one integer per file, in sorted-name order) or, with
``labels="dirname"``, from sub-directory names (``class_a/x.jpg``: sorted class names
numbered from 0). Samples are delivered raw (the file's bytes); ``.npz`` files decode
to their first array with ``feedline.formats.files.load_npz``.
"""

from __future__ import annotations

import io
import os
import zipfile
from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError, CorruptDataError, UnsupportedFormatError
from ..index import Index
from .base import Format, register

#: what a directory of files is recognised by (sniffing and ``detect``)
EXTENSIONS = (".npz", ".jpg", ".jpeg", ".png", ".bin")


def _walk(root: str, extensions: tuple[str, ...]) -> list[str]:
    out = []
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith("."))
        out += [
            os.path.join(d, f)
            for f in names
            if not f.startswith(".") and (not extensions or f.lower().endswith(extensions))
        ]
    return sorted(out)


@register
class FilesFormat(Format):
    """One sample per file. Options: ``extensions`` (tuple or comma-separated string,
    default .npz/.jpg/.jpeg/.png/.bin; ``""`` = every file), ``labels`` (``.npy`` path
    or ``"dirname"``)."""

    name = "files"
    extensions: ClassVar[tuple[str, ...]] = EXTENSIONS
    options: ClassVar[tuple[str, ...]] = ("extensions", "labels")

    def resolve(self, path):
        ext = self.opts.get("extensions", EXTENSIONS)
        if isinstance(ext, str):
            ext = tuple(e.strip().lower() for e in ext.split(",") if e.strip())
        ext = tuple(ext)
        if isinstance(path, list | tuple):
            files = [os.path.abspath(os.fspath(p)) for p in path]
            if not files:
                raise ConfigError("empty list of dataset files")
            for f in files:
                if not os.path.isfile(f):
                    raise FileNotFoundError(f"no such dataset file: {f!r}")
            return os.path.commonpath([os.path.dirname(f) for f in files]), files
        p = os.path.abspath(os.fspath(path))
        if os.path.isfile(p):
            return os.path.dirname(p), [p]
        if not os.path.isdir(p):
            raise FileNotFoundError(f"no such dataset: {p!r}")
        files = _walk(p, ext)
        if not files:
            raise UnsupportedFormatError(p, f"directory holds no files ending in {ext}")
        return p, files

    def build_index(self, progress: bool = False) -> Index:
        sizes = np.fromiter((os.stat(f).st_size for f in self.files), np.int64, len(self.files))
        empty = np.flatnonzero(sizes == 0)
        if len(empty):
            raise CorruptDataError(self.files[int(empty[0])], 0, "empty file: no sample")
        n = len(self.files)
        return Index(
            files=list(self.files),
            file_ids=np.arange(n, dtype=np.int32),
            offsets=np.zeros(n, dtype=np.int64),
            lengths=sizes,
            labels=self._labels(n),
            meta={"layout": "one sample per file", "root": self.root},
        )

    def _labels(self, n: int) -> np.ndarray | None:
        spec = self.opts.get("labels")
        if spec is None:
            return None
        if spec == "dirname":
            rel = [os.path.relpath(os.path.dirname(f), self.root) for f in self.files]
            names = sorted(set(rel))
            code = {d: i for i, d in enumerate(names)}
            return np.array([code[d] for d in rel], dtype=np.int64)
        labels = np.load(os.fspath(spec), allow_pickle=False)
        if labels.ndim != 1 or len(labels) != n:
            raise ConfigError(
                f"labels {spec!r}: need {n} labels (one per file), got {labels.shape}"
            )
        return labels.astype(np.int64)


def load_npz(raw: Any, path: str = "<npz>", key: str | None = None) -> np.ndarray:
    """The array *key* (default: the first) of one raw ``.npz`` sample."""
    try:
        with np.load(io.BytesIO(memoryview(raw).cast("B").tobytes()), allow_pickle=False) as z:
            return z[key or z.files[0]]
    except (ValueError, OSError, KeyError, IndexError, zipfile.BadZipFile) as e:
        raise CorruptDataError(path, 0, f"not a readable .npz ({e})") from None
