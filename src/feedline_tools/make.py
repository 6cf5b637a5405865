# SPDX-License-Identifier: Apache-2.0
"""``feedline make``: synthetic datasets shaped like the papers', deterministic from a seed.

Generators (``feedline make NAME --help`` for each one's options):

  cifar10-large    LMDB of Caffe Datums 3x32x32, 10 classes (LMDBIO's CIFAR10-Large)
  imagenet         LMDB of Caffe Datums 3x256x256 (~192 KB), 1000 classes; --encoded JPEG
  cosmoflow        HDF5 files of side^3 x 12 uint16 cubes + 4 float32 targets
  neuron-inverter  HDF5 files of 1600x3 float32 traces + 19 float32 targets
  cifar10-bin      CIFAR-10 binary records (1 label byte + 3,072 bytes)
  tfrecord         TFRecord files of images + labels
  npy              data.npy + labels.npy

Samples are written class-sorted (as datasets converted from class folders are) unless
``--shuffle``; the contents are a pure function of ``--seed``, and a shuffled dataset
holds exactly the samples of the sorted one. Classes are learnable (one smooth template
per class plus per-sample shifts and noise); regression targets are functions of the
data. See docs/datasets.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from feedline_tools.generate import SPECS, Result, run

EXAMPLES = """\
examples:
  feedline make cifar10-large --samples 200000 --out /scratch/cifar10_large_lmdb
  feedline make imagenet --samples 5000 --encoded --out /scratch/imagenet_jpeg_lmdb
  feedline make cosmoflow --samples 256 --cube 64 --files 8 --out /scratch/cosmoflow
  feedline make cifar10-large --samples 50000 --shuffle --seed 7 --out cifar_shuffled
  feedline inspect /scratch/cifar10_large_lmdb      # what was written, and its layout
"""


def generate(
    name: str,
    out: str | os.PathLike[str],
    samples: int | None = None,
    seed: int = 0,
    shuffle: bool = False,
    *,
    force: bool = False,
    progress: bool | None = None,
    **kw: Any,
) -> str:
    """Write a synthetic dataset and return its path.

    Parameters
    ----------
    name : str
        Generator: ``"cifar10-large"``, ``"imagenet"``, ``"cosmoflow"``,
        ``"neuron-inverter"``, ``"cifar10-bin"``, ``"tfrecord"`` or ``"npy"``.
    out : path
        Output directory (created; the dataset's files go inside it).
    samples : int, optional
        Number of samples (each generator has a small default).
    seed : int
        Contents are a pure function of the seed (and the options).
    shuffle : bool
        Write samples in a seeded random order instead of class-sorted order.
    force : bool
        Replace *out* when it exists and is not empty (refused otherwise).
    progress : bool, optional
        Show a progress bar (default: on terminals; see :mod:`feedline.progress`).
    **kw
        Generator options, e.g. ``classes=100``, ``image_size=64``, ``commit_every=500``,
        ``encoded=True`` (LMDB), ``cube=64``, ``files=8`` (HDF5), ``payload="example"``
        (TFRecord). Unknown options raise :class:`~feedline.ConfigError`.

    Returns
    -------
    str
        The absolute path of the dataset directory (pass it to ``open_dataset``; the
        exact call is in the manifest's ``format`` and ``open_options``).

    Examples
    --------
    >>> from feedline_tools.make import generate
    >>> path = generate("cifar10-large", "/tmp/cifar", samples=2000, seed=1)
    >>> ds = feedline.open_dataset(path)
    """
    return run(name, out, samples, seed, shuffle, force=force, show_progress=progress, **kw).path


# ---------------------------------------------------------------------------- CLI


def _bool_flag(parser: argparse.ArgumentParser, flag: str, help_: str) -> None:
    parser.add_argument(flag, action="store_true", default=None, help=help_)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``feedline make`` and one sub-command per generator."""
    p = sub.add_parser(
        "make",
        help="write a synthetic dataset shaped like the papers'",
        description=__doc__,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gens = p.add_subparsers(dest="generator", metavar="NAME")
    for spec in SPECS.values():
        g = gens.add_parser(
            spec.name,
            help=spec.summary,
            description=f"{spec.summary}.\nMimics: {spec.mimics}.",
            epilog=EXAMPLES,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        g.add_argument(
            "--out",
            "-o",
            required=True,
            metavar="PATH",
            help="output directory (created; refused if not empty, see --force)",
        )
        g.add_argument(
            "--samples",
            "-n",
            type=int,
            default=spec.default_samples,
            metavar="N",
            help=f"number of samples (default {spec.default_samples:,})",
        )
        g.add_argument(
            "--seed", type=int, default=0, help="contents are a pure function of it (default 0)"
        )
        g.add_argument(
            "--shuffle",
            action="store_true",
            help="write samples in a seeded random order (default: class-sorted)",
        )
        g.add_argument("--force", action="store_true", help="replace PATH if it exists")
        g.add_argument("--no-progress", action="store_true", help="no progress bar")
        opts = g.add_argument_group(f"{spec.name} options")
        for o in spec.options:
            if isinstance(o.default, bool):
                _bool_flag(opts, o.flag, o.help)
            else:
                opts.add_argument(
                    o.flag,
                    dest=o.name,
                    type=type(o.default),
                    default=None,
                    choices=o.choices,
                    metavar=None if o.choices else o.name.upper(),
                    help=f"{o.help} (default {o.default})",
                )
        g.set_defaults(func=_main, spec=spec.name)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def _main(args: argparse.Namespace) -> int:
    spec = SPECS[args.spec]
    kw = {o.name: getattr(args, o.name) for o in spec.options if getattr(args, o.name) is not None}
    try:
        res: Result = run(
            spec.name,
            args.out,
            args.samples,
            args.seed,
            args.shuffle,
            force=args.force,
            show_progress=False if args.no_progress else None,
            **kw,
        )
    except OSError as e:  # unwritable or full output: a message, not a traceback
        print(f"feedline: error: cannot write {args.out}: {e}", file=sys.stderr)
        return 1
    print(res.summary())
    sys.stdout.flush()
    return 0


__all__ = ["add_parser", "generate"]
