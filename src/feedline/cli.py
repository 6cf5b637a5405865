# SPDX-License-Identifier: Apache-2.0
"""The ``feedline`` command line.

Each subcommand lives in its own module exposing ``add_parser(subparsers)``, which
registers the parser and sets ``func``; modules are imported only when listed here, so
``feedline --help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys

from .errors import FeedlineError

# subcommand -> module with add_parser(); order is the order shown in --help
COMMANDS = {
    "make": "feedline_tools.make",
    "index": "feedline.inspect",
    "inspect": "feedline.inspect",
    "plan": "feedline.plan.cli",
    "probe": "feedline.io.probe",
    "bench": "feedline_tools.bench.cli",
    "demo": "feedline_tools.demo",
    "emulate": "feedline_tools.emulate.cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="feedline",
        description="feedline: data loading for distributed deep learning on HPC storage.",
        epilog="Run 'feedline COMMAND --help' for the options of a command.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    seen: set[str] = set()
    for modname in COMMANDS.values():
        if modname in seen:
            continue
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("feedline"):
                continue  # subcommand not built yet
            raise
        mod.add_parser(sub)
        seen.add(modname)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line. Under ``mpiexec``/``srun`` only rank 0 writes to stdout
    (help, tables; progress bars are rank 0's already); errors go to every rank's
    stderr. A closed pipe (``feedline inspect ... | head -1``) ends quietly."""
    from .progress import process_rank

    with contextlib.ExitStack() as stack:
        if process_rank() != 0:
            sink = stack.enter_context(open(os.devnull, "w"))
            stack.enter_context(contextlib.redirect_stdout(sink))
        try:
            code = _run(argv)
            sys.stdout.flush()
            return code
        except BrokenPipeError:
            # the reader went away: silence the interpreter's final flush too
            with contextlib.suppress(OSError, ValueError):
                fd = os.open(os.devnull, os.O_WRONLY)
                os.dup2(fd, sys.stdout.fileno())
            return 141  # 128 + SIGPIPE, as a shell reports it


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except FeedlineError as e:
        print(f"feedline: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("feedline: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
