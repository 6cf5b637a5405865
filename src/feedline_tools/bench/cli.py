# SPDX-License-Identifier: Apache-2.0
"""``feedline bench SCENARIO``: side-by-side measurements.

Each scenario is a module with ``add_arguments(parser)`` and ``run(args) -> int``; it is
listed in SCENARIOS and imported only when asked for.
"""

from __future__ import annotations

import argparse
import importlib

SCENARIOS = {
    "index": (
        "feedline_tools.bench.index_bench",
        "LMDB/HDF5/TFRecord index build: time and bytes read",
    ),
    "lmdbio": (
        "feedline_tools.bench.lmdbio",
        "LMDBIO microbenchmark (§5.1): every preset, cold cache",
    ),
    "async": (
        "feedline_tools.bench.async_bench",
        "asynchronous-I/O paper Tables II-V, buffer sweep",
    ),
    "shuffle": ("feedline_tools.bench.shuffle", "shuffle quality: RL and accuracy of a small CNN"),
    "overhead": (
        "feedline_tools.bench.overhead",
        "Loader CPU overhead per sample vs PyTorch DataLoader",
    ),
    "deepio": (
        "feedline_tools.bench.deepio_bench",
        "DeepIO Figs. 9, 10, 13, Table I and RL: the in-memory store",
    ),
    "peers": (
        "feedline_tools.bench.peers",
        "torch, Mosaic, WebDataset, LitData, tf.data vs feedline",
    ),
    "readers": (
        "feedline_tools.bench.readers",
        "pread vs mmap vs per-sample reads (LMDBIO Fig. 8)",
    ),
    "compressed": (
        "feedline_tools.bench.compressed",
        "gzip+shuffle chunked HDF5: feedline vs h5py reading the same file",
    ),
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="run side-by-side benchmarks", description=__doc__)
    scen = p.add_subparsers(dest="scenario", metavar="SCENARIO")
    for name, (modname, help_) in SCENARIOS.items():
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("feedline"):
                continue
            raise
        sp = scen.add_parser(
            name,
            help=help_,
            description=mod.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        mod.add_arguments(sp)
        sp.set_defaults(func=mod.run)
    p.set_defaults(func=lambda args: p.print_help() or 2)
