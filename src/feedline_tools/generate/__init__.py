# SPDX-License-Identifier: Apache-2.0
"""Synthetic datasets shaped like the papers' (``feedline make``), by name.

A generator is a :class:`Spec`: a writer plus a table of options with defaults, from
which both the Python keywords and the command-line flags are derived, so the two never
disagree. :func:`run` writes into a temporary sibling directory and renames it into
place only when every file is complete, so an interrupted run never leaves a dataset
that looks whole; a manifest (``.feedline-make.json``, hidden from format detection)
records how the dataset was made, including LMDB provenance (LMDBIO §4.4).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from feedline.dataset import MANIFEST, read_manifest
from feedline.errors import ConfigError
from feedline.progress import progress
from feedline_tools.generate import writers
from feedline_tools.generate.synth import positions

MANIFEST_VERSION = 1


@dataclass(frozen=True)
class Option:
    """One generator option: keyword ``name``, flag ``--name-with-dashes``."""

    name: str
    default: Any
    help: str
    choices: tuple[str, ...] | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def convert(self, value: Any) -> Any:
        """Coerce an API value to the option's type (bool, int, str)."""
        kind = type(self.default)
        if kind is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"{self.name} must be True or False, not {value!r}")
            return value
        try:
            out = kind(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{self.name} must be {kind.__name__}, not {value!r}") from None
        if kind is int and out != value:
            raise ConfigError(f"{self.name} must be an integer, not {value!r}")
        if self.choices and out not in self.choices:
            raise ConfigError(f"{self.name} must be one of {list(self.choices)}, not {value!r}")
        return out


@dataclass(frozen=True)
class Spec:
    """A named generator."""

    name: str
    summary: str
    mimics: str
    default_samples: int
    options: tuple[Option, ...]
    write: Callable[[writers.Job], dict[str, Any]]

    def resolve(self, kw: dict[str, Any]) -> dict[str, Any]:
        """Defaults overridden by *kw*; unknown keywords raise ConfigError."""
        known = {o.name: o for o in self.options}
        unknown = sorted(set(kw) - set(known))
        if unknown:
            raise ConfigError(
                f"generator {self.name!r} does not take {unknown}; it takes {sorted(known) or 'none'}"
            )
        return {
            name: (o.convert(kw[name]) if name in kw else o.default) for name, o in known.items()
        }


def _image_opts(classes: int, size: int) -> tuple[Option, ...]:
    return (
        Option("classes", classes, "number of classes (balanced; class-sorted unless --shuffle)"),
        Option("image_size", size, "image height and width in pixels"),
        Option("channels", 3, "image channels"),
    )


def _h5_opts() -> tuple[Option, ...]:
    return (
        Option(
            "compression",
            "none",
            "HDF5 filters: none (contiguous), gzip, gzip-shuffle, lzf or lzf-shuffle "
            "(chunked, --chunk-samples samples per chunk)",
            ("none", "gzip", "gzip-shuffle", "lzf", "lzf-shuffle"),
        ),
        Option("chunk_samples", 16, "samples per HDF5 chunk with --compression"),
    )


def _lmdb_opts(classes: int, size: int) -> tuple[Option, ...]:
    return (
        *_image_opts(classes, size),
        Option(
            "commit_every", 1000, "records per write transaction (Caffe's convert_imageset: 1000)"
        ),
        Option(
            "encoded",
            False,
            "store JPEG-encoded Datums (encoded=true), as convert_imageset --encoded",
        ),
        Option("quality", 90, "JPEG quality for --encoded"),
        Option("map_size", 64 << 20, "initial LMDB map size in bytes; doubled whenever it fills"),
    )


SPECS: dict[str, Spec] = {
    s.name: s
    for s in (
        Spec(
            "cifar10-large",
            "LMDB of Caffe Datums, 3x32x32 uint8, 10 classes (~3 KB records)",
            "CIFAR10-Large of the LMDBIO papers (50 M x 3 KB records, Caffe convert_imageset)",
            50_000,
            _lmdb_opts(10, 32),
            writers.write_lmdb,
        ),
        Spec(
            "imagenet",
            "LMDB of Caffe Datums, 3x256x256 uint8 (~192 KB), 1000 classes; --encoded for JPEG",
            "ImageNet LMDB of the LMDBIO and MPI-Caffe papers (1.2 M x 192 KB records)",
            2_000,
            _lmdb_opts(1000, 256),
            writers.write_lmdb,
        ),
        Spec(
            "cosmoflow",
            "HDF5 files of uint16 cubes (side^3 x 12) + 4 float32 targets",
            "CosmoFlow of the asynchronous-I/O paper (64 files x 128 samples of 128^3 x 12 uint16)",
            64,
            (
                Option("cube", 32, "cube side (the paper uses 128)"),
                Option("channels", 12, "channels per voxel (the paper uses 12)"),
                Option("files", 4, "number of HDF5 files; samples are split evenly"),
                *_h5_opts(),
            ),
            writers.write_cosmoflow,
        ),
        Spec(
            "neuron-inverter",
            "HDF5 files of 1600x3 float32 traces + 19 float32 targets",
            "Neuron-Inverter of the asynchronous-I/O paper (~610 K samples of 1600 x 3 float32 per file)",
            10_000,
            (
                Option("length", 1600, "time steps per trace"),
                Option("channels", 3, "recording locations per trace"),
                Option("targets", 19, "regression targets (conductances) per sample"),
                Option("files", 4, "number of HDF5 files; samples are split evenly"),
                *_h5_opts(),
            ),
            writers.write_neuron,
        ),
        Spec(
            "cifar10-bin",
            "CIFAR-10 binary records (1 label byte + 3,072 pixel bytes) in a few files",
            "the CIFAR-10 binary distribution (data_batch_1..5.bin)",
            50_000,
            (*_image_opts(10, 32), Option("files", 5, "number of data_batch_*.bin files")),
            writers.write_cifar_bin,
        ),
        Spec(
            "tfrecord",
            "TFRecord files of images + labels (raw bytes or tf.train.Example payloads)",
            "TFRecord input of the DeepIO and asynchronous-I/O papers' TensorFlow baselines",
            10_000,
            (
                *_image_opts(10, 32),
                Option("files", 4, "number of .tfrecord files"),
                Option(
                    "payload",
                    "raw",
                    "record payload: raw (int32 LE label + pixels) or example (tf.train.Example)",
                    ("raw", "example"),
                ),
                Option(
                    "compression",
                    "none",
                    "none, or gzip (TensorFlow's compression_type='GZIP'; files end in .gz)",
                    ("none", "gzip"),
                ),
                Option(
                    "records_per_member",
                    64,
                    "gzip: records per gzip member, so readers can start at any member "
                    "(0: one member per file, as plain gzip; feedline then uses restart points)",
                ),
            ),
            writers.write_tfrecord,
        ),
        Spec(
            "npy",
            "data.npy (N, 3, 32, 32) uint8 + labels.npy (N,) int64",
            "an in-memory-friendly array dataset (DeepIO-style small elements)",
            10_000,
            _image_opts(10, 32),
            writers.write_npy,
        ),
    )
}


@dataclass(frozen=True)
class Result:
    """What :func:`run` made."""

    path: str
    name: str
    samples: int
    seconds: float
    nbytes: int
    facts: dict[str, Any]

    def summary(self) -> str:
        """One line for the terminal."""
        f = self.facts
        what = f"{f['classes']} classes" if "classes" in f else f"{f.get('targets')} targets"
        order = (
            "shuffled"
            if f["shuffle"]
            else ("class-sorted" if "classes" in f else "sorted by target 0")
        )
        rate = self.nbytes / max(self.seconds, 1e-9) / 1e6
        return (
            f"{self.name}: {self.samples:,} samples of {'x'.join(map(str, f['sample_shape']))} "
            f"{f['dtype']} ({what}, {order}) -> {self.path} "
            f"[{f['format']}, {len(f['files'])} file(s), {_human(self.nbytes)}] "
            f"in {self.seconds:.1f} s ({rate:.0f} MB/s)"
        )


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


def _check_out(out: str, force: bool) -> bool:
    """Whether *out* exists and will be replaced; refuse what must not be replaced."""
    if not os.path.lexists(out):
        return False
    if os.path.isdir(out) and not os.path.islink(out) and not os.listdir(out):
        return True
    if not force:
        raise ConfigError(f"{out} exists and is not empty; pass force=True (--force) to replace it")
    home = os.path.realpath(os.path.expanduser("~"))
    real = os.path.realpath(out)
    cwd = os.path.realpath(os.getcwd())
    if real in (os.path.sep, home) or os.path.commonpath([real, cwd]) == real:
        raise ConfigError(
            f"refusing to replace {out}: it is /, your home or holds the current directory"
        )
    return True


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def run(
    name: str,
    out: str | os.PathLike[str],
    samples: int | None = None,
    seed: int = 0,
    shuffle: bool = False,
    *,
    force: bool = False,
    show_progress: bool | None = None,
    **kw: Any,
) -> Result:
    """Generate dataset *name* into directory *out*; see :func:`feedline_tools.make.generate`."""
    spec = SPECS.get(name)
    if spec is None:
        raise ConfigError(f"unknown dataset generator {name!r}; known: {', '.join(SPECS)}")
    opts = spec.resolve(kw)
    n = spec.default_samples if samples is None else samples
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"samples must be a positive integer, not {samples!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, not {seed!r}")
    out = os.path.abspath(os.fspath(out))
    replace = _check_out(out, force)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.making-", dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; a dataset is shared like any directory
    t0 = time.perf_counter()
    try:
        with progress(n, f"make {name}", show_progress, unit=" samples", unit_scale=True) as bar:
            job = writers.Job(name, tmp, n, seed, positions(n, seed, shuffle), opts, bar)
            facts = spec.write(job)
        facts.update(
            generator=name,
            mimics=spec.mimics,
            version=MANIFEST_VERSION,
            samples=n,
            seed=seed,
            shuffle=bool(shuffle),
            options=opts,
        )
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump(facts, f, indent=2, sort_keys=True)
            f.write("\n")
        nbytes = sum(os.path.getsize(os.path.join(tmp, p)) for p in facts["files"])
        if replace:
            _remove(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Result(out, name, n, time.perf_counter() - t0, nbytes, facts)


__all__ = ["MANIFEST", "SPECS", "Option", "Result", "Spec", "read_manifest", "run"]
