# SPDX-License-Identifier: Apache-2.0
"""``feedline emulate``: mount, inspect and unmount the storage emulator.

  feedline emulate up SRC MNT --nodes M [--config FILE] [--latency-us X ...]
  feedline emulate stats MNT [--requests]
  feedline emulate reset MNT          zero the accounting
  feedline emulate drop MNT [--node N]  make the next reads cold
  feedline emulate down MNT
  feedline emulate overhead           measure the emulator's own overhead here

Parameters come from the defaults, then the config file (TOML or JSON), then the
command line. ``up`` returns once the views answer; the daemon keeps running until
``down``. Exit status 69 means the emulator cannot run here (no /dev/fuse or no binary).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from feedline_tools.emulate.mount import EXIT_UNAVAILABLE, Emulator, EmulatorUnavailable, unmount
from feedline_tools.emulate.params import EmulatorParams


def _up(args: argparse.Namespace) -> int:
    params = EmulatorParams.from_file(args.config) if args.config else EmulatorParams()
    changes = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(EmulatorParams)
        if getattr(args, f.name) is not None
    }
    params = params.replace(**changes)
    emu = Emulator(
        args.src, args.mnt, nodes=args.nodes, params=params, detach=True, timeout=args.timeout
    )
    emu.start()
    print(
        f"feedline emulate: {emu.nodes} node view(s) of {emu.src} at {emu.node_template} "
        f"(daemon pid {emu.pid}, log {emu.log_path})"
    )
    print(f"  stop with: feedline emulate down {emu.mountpoint}")
    return 0


def _down(args: argparse.Namespace) -> int:
    unmount(args.mnt, timeout=args.timeout)
    print(f"feedline emulate: unmounted {args.mnt}")
    return 0


def _stats(args: argparse.Namespace) -> int:
    emu = Emulator.attach(args.mnt)
    out = emu.requests() if args.requests else emu.stats()
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


def _reset(args: argparse.Namespace) -> int:
    Emulator.attach(args.mnt).reset_stats()
    return 0


def _drop(args: argparse.Namespace) -> int:
    Emulator.attach(args.mnt).drop_caches(args.node)
    return 0


def _overhead(args: argparse.Namespace) -> int:
    from feedline_tools.emulate.measure import measure_overhead

    results = measure_overhead(
        size=args.size_mib << 20, block=args.block_kib << 10, repeats=args.repeats
    )
    print(
        f"{args.size_mib} MiB in {args.block_kib} KiB O_DIRECT reads, one synchronous reader, "
        "default model:"
    )
    for r in results:
        print(
            f"  per request (median): daemon {r.daemon_median:6.1%}  reader {r.reader_median:6.1%}"
            f"   whole read {r.client:6.1%}  {r.mbps:5.0f} MB/s  ({r.requests} requests, "
            f"modelled {r.modelled_s:.3f} s, wall {r.wall_s:.3f} s)"
        )
    return 0


def _guard(func):
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except EmulatorUnavailable as e:
            print(f"feedline emulate: unavailable: {e}", file=sys.stderr)
            return EXIT_UNAVAILABLE

    return run


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "emulate",
        help="storage emulator: node views of a directory over FUSE",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    acts = p.add_subparsers(dest="action", metavar="ACTION")

    up = acts.add_parser("up", help="mount MNT/node0..node{M-1} as views of SRC")
    up.add_argument("src", help="directory to serve")
    up.add_argument("mnt", help="mount point (created if missing, must be empty)")
    up.add_argument("--nodes", type=int, default=1, help="emulated nodes M (default 1)")
    up.add_argument("--config", help="TOML or JSON file of parameters")
    up.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the mount")
    defaults = EmulatorParams()
    for f in dataclasses.fields(EmulatorParams):
        up.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            type=type(f.default),
            default=None,
            metavar=type(f.default).__name__.upper(),
            help=f"(default {getattr(defaults, f.name)})",
        )
    up.set_defaults(func=_guard(_up))

    for name, fn, help_ in (
        ("down", _down, "unmount and stop the daemon"),
        ("stats", _stats, "print the accounting as JSON"),
        ("reset", _reset, "zero the accounting"),
        ("drop", _drop, "drop the node views' page caches"),
    ):
        a = acts.add_parser(name, help=help_)
        a.add_argument("mnt", help="the emulator's mount point (or any path inside it)")
        if name == "down":
            a.add_argument("--timeout", type=float, default=10.0)
        if name == "stats":
            a.add_argument("--requests", action="store_true", help="the per-request log instead")
        if name == "drop":
            a.add_argument("--node", type=int, default=None, help="only this node's view")
        a.set_defaults(func=_guard(fn))

    ov = acts.add_parser("overhead", help="measure the emulator's own overhead here")
    ov.add_argument("--size-mib", type=int, default=64)
    ov.add_argument("--block-kib", type=int, default=1024)
    ov.add_argument("--repeats", type=int, default=3)
    ov.set_defaults(func=_guard(_overhead))

    def _help(args: argparse.Namespace) -> int:
        p.print_help()
        return 2

    p.set_defaults(func=_help)
